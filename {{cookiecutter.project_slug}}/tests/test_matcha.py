"""Matcha-TTS's network beyond the reference's numbers (``test_parity_matcha.py``): what its gradients reach, and
the shapes and masking of synthesis, on a tiny model."""

import torch

from models.matcha.network import MatchaTTS, fix_length

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
