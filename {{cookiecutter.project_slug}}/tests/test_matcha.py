"""Matcha-TTS's network beyond the reference's numbers (``test_parity_matcha.py``): what its gradients reach, the
shapes and masking of synthesis, and the training segments of ``matcha.out_size``, on a tiny model."""

import math

import torch
import torch.nn.functional as F

from models.matcha.network import MatchaTTS, cut_segments, fix_length, segment_offsets
from modules.matcha import sequence_mask

TINY = {"encoder": {"n_channels": 32, "filter_channels": 64, "filter_channels_dp": 32, "n_layers": 2},
        "decoder": {"channels": (32, 32), "attention_head_dim": 16}}


def tiny_model(n_spks: int = 1) -> MatchaTTS:
    torch.manual_seed(0)
    return MatchaTTS(n_vocab=20, n_spks=n_spks, spk_emb_dim=8, n_feats=16, **TINY)


def batch():
    """Token ids (2, 6) of lengths (6, 4), mels (2, 16, 24) of lengths (24, 15), zero past them."""
    generator = torch.Generator().manual_seed(1)
    lengths, mel_lengths = torch.tensor([6, 4]), torch.tensor([24, 15])
    ids = torch.randint(1, 20, (2, 6), generator=generator) * (torch.arange(6) < lengths[:, None])
    mel = torch.randn(2, 16, 24, generator=generator) * (torch.arange(24) < mel_lengths[:, None, None])
    return ids, lengths, mel, mel_lengths


def test_the_duration_loss_trains_only_the_duration_predictor_and_the_others_reach_everything():
    """The duration predictor reads a detached copy of the encoder's output (as the reference): its loss leaves the
    rest of the encoder without gradient; the prior and flow-matching losses reach every other parameter (the prenet's
    convolutions once its projection, which starts at zero as the reference's, has moved)."""
    model = tiny_model(n_spks=3).train()
    ids, lengths, mel, mel_lengths = batch()
    duration, prior, flow, attn = model.losses(ids, lengths, mel, mel_lengths, torch.tensor([0, 2]))
    assert all(torch.isfinite(loss) for loss in (duration, prior, flow))
    assert torch.equal(attn.sum(1), (torch.arange(24) < mel_lengths[:, None]).float())  # each frame: one token
    duration.backward(retain_graph=True)
    for name, parameter in model.named_parameters():
        reached = parameter.grad is not None and bool(parameter.grad.abs().sum() > 0)
        assert reached == name.startswith("encoder.durations."), name
    model.zero_grad()
    (prior + flow).backward()
    waiting = ("encoder.durations.", "encoder.prenet.convs.", "encoder.prenet.norms.")
    for name, parameter in model.named_parameters():
        reached = parameter.grad is not None and bool(parameter.grad.abs().sum() > 0)
        assert reached != name.startswith(waiting), name


def test_synthesis_gives_each_token_its_rounded_up_frames_and_moves_no_frame_past_them():
    """Frames past an item's length (to the longest item's, rounded up to a multiple of 4) keep the starting noise
    (times the temperature): the vector field is masked there, as the reference's."""
    model = tiny_model().eval()
    ids, lengths, _, _ = batch()
    generator = torch.Generator().manual_seed(2)
    durations = torch.ceil(torch.exp(model.encode(ids, lengths)[1]))
    noise = torch.randn(2, 16, fix_length(int(durations.sum([1, 2]).max())), generator=generator)
    out = model.synthesise(ids, lengths, n_timesteps=2, temperature=0.5, noise=noise)
    frames = out["durations"].sum([1, 2]).long()
    assert torch.equal(out["mel_lengths"], frames) and out["durations"].min() >= 0
    assert out["decoder_out"].shape == (2, 16, fix_length(int(frames.max())))
    assert fix_length(int(frames.max())) % 4 == 0
    past = torch.arange(out["decoder_out"].shape[-1]) >= frames[:, None, None]
    assert torch.equal(out["decoder_out"].masked_select(past), (noise * 0.5).masked_select(past))
    assert not torch.equal(out["decoder_out"].masked_select(~past), (noise * 0.5).masked_select(~past))
    assert torch.equal(out["attn"].sum(2), out["durations"].squeeze(1))


def reference_cut(mel, attn, mel_lengths, out_size, offsets):
    """The authors' cut in ``MatchaTTS.forward``, item by item: ``out_size + min(length - out_size, 0)`` frames from
    the offset, zeros after."""
    mel_cut = torch.zeros(mel.shape[0], mel.shape[1], out_size)
    attn_cut = torch.zeros(attn.shape[0], attn.shape[1], out_size)
    lengths = []
    for i, offset in enumerate(offsets.tolist()):
        length = out_size + int((mel_lengths[i] - out_size).clamp(None, 0))
        lengths.append(length)
        mel_cut[i, :, :length] = mel[i, :, offset:offset + length]
        attn_cut[i, :, :length] = attn[i, :, offset:offset + length]
    return mel_cut, attn_cut, torch.tensor(lengths)


def test_the_training_segments_are_the_references_cut_at_fixed_offsets():
    """Items longer and shorter than ``out_size``, offsets at 0, inside and at the last start the reference draws;
    the batch's frames (24) fewer than ``out_size`` (32) too."""
    _, _, mel, mel_lengths = batch()
    attn = torch.rand(2, 6, 24)
    for out_size, offsets in ((8, (15, 6)), (8, (0, 0)), (16, (7, 0)), (32, (0, 0))):
        offsets = torch.tensor(offsets)
        got = cut_segments(mel, attn, mel_lengths, out_size, offsets)
        for ours, theirs in zip(got, reference_cut(mel, attn, mel_lengths, out_size, offsets)):
            assert torch.equal(ours, theirs), (out_size, offsets)


def test_segment_offsets_are_uniform_over_the_references_range():
    """``random.choice(range(0, length - out_size))``: 0 .. length - out_size - 1, each drawn, and 0 where the item
    is at most ``out_size + 1`` frames long."""
    torch.manual_seed(0)
    lengths = torch.tensor([24, 15, 9, 8, 3])
    offsets = segment_offsets(lengths.repeat(400), 8).view(400, 5)
    for column, length in enumerate(lengths.tolist()):
        assert set(offsets[:, column].tolist()) == set(range(max(1, length - 8))), length


def test_with_out_size_the_prior_and_flow_losses_read_the_cut_segment():
    """``losses`` with ``out_size`` 8: the alignment returned is the full alignment's segment at the offsets its seed
    draws, and the prior and flow matching losses are those of the cut mel under the cut alignment (the duration loss
    reads the whole alignment)."""
    model = tiny_model().eval()
    ids, lengths, mel, mel_lengths = batch()
    t, noise = torch.full((2, 1, 1), 0.3), torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(4))
    whole = model.losses(ids, lengths, mel, mel_lengths, t=t, noise=torch.randn_like(mel))
    model.out_size = 8
    torch.manual_seed(3)
    duration, prior, flow, attn = model.losses(ids, lengths, mel, mel_lengths, t=t, noise=noise)
    torch.manual_seed(3)
    mel_cut, attn_cut, cut_lengths = cut_segments(mel, whole[3], mel_lengths, 8, segment_offsets(mel_lengths, 8))
    assert torch.equal(attn, attn_cut) and torch.equal(duration, whole[0])
    mu_x = model.encode(ids, lengths)[0]
    mu_y = torch.matmul(attn_cut.transpose(1, 2), mu_x.transpose(1, 2)).transpose(1, 2)
    mask = sequence_mask(cut_lengths, 8).unsqueeze(1).float()
    expected = torch.sum(0.5 * ((mel_cut - mu_y) ** 2 + math.log(2 * math.pi)) * mask) / (mask.sum() * 16)
    torch.testing.assert_close(prior, expected)
    u = mel_cut - (1 - model.sigma_min) * noise
    field = model.decoder((1 - (1 - model.sigma_min) * t) * noise + t * mel_cut, mask, mu_y, t.squeeze())
    torch.testing.assert_close(flow, F.mse_loss(field, u, reduction="sum") / (mask.sum() * 16))
