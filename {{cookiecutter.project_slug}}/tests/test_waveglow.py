"""WaveGlow: exact invertibility, the likelihood formula, learning, and inference shapes."""

import json
import math
import os

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import ROOT, check_recipe, synth_corpus, tensorboard_audio, tiny_checkpoint, train_with_validation_every_step
from test_checkpoint_safety import LARGER, crafted_outcomes, larger_refused
from torch._dynamo.utils import counters

import inference
from models import MODELS
from models.waveglow.network import WaveGlow, WaveGlowConfig, WaveGlowLoss
from modules.waveglow import WN, Invertible1x1Conv

TINY = WaveGlowConfig(n_flows=4, n_group=8, n_early_every=2, n_early_size=2, wn_layers=2, wn_channels=16)


def make_model(cfg=TINY, dtype=torch.float64, perturb=True):
    torch.manual_seed(0)
    model = WaveGlow(cfg, n_mels=10, hop_length=16, win_length=64).to(dtype)
    if perturb:  # the zero-initialised last layers make every coupling the identity; leave that state
        with torch.no_grad():
            for wn in model.flows:
                wn.end.weight.normal_(0, 0.05)
                wn.end.bias.normal_(0, 0.05)
    return model


def make_batch(batch=2, frames=12, dtype=torch.float64):
    torch.manual_seed(1)
    return {"mel": torch.randn(batch, 10, frames, dtype=dtype),
            "audio": 0.5 * torch.randn(batch, frames * 16, dtype=dtype).clamp(-1.9, 1.9) / 2}


def test_reverse_inverts_forward():
    model = make_model()
    batch = make_batch()
    z, log_s, log_det = model(batch)
    assert z.shape == (2, 8, 12 * 16 // 8)
    assert len(log_s) == len(log_det) == TINY.n_flows
    restored = model.reverse(batch["mel"], z)
    assert torch.allclose(restored, batch["audio"], atol=1e-9), (restored - batch["audio"]).abs().max()


def test_invertible_conv_inverse_and_log_determinant():
    torch.manual_seed(0)
    conv = Invertible1x1Conv(6).double()
    with torch.no_grad():
        conv.weight.add_(0.3 * torch.randn(6, 6, dtype=torch.float64))
    z = torch.randn(3, 6, 5, dtype=torch.float64)
    y, log_det = conv(z)
    assert torch.allclose(conv.inverse(y), z, atol=1e-10)
    expected = 3 * 5 * math.log(abs(torch.linalg.det(conv.weight).item()))
    assert log_det.item() == pytest.approx(expected, rel=1e-9)


def test_wn_rejects_even_kernel():
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        WN(4, 10, 2, 8, kernel_size=4)


def test_loss_matches_the_gaussian_negative_log_likelihood():
    model = make_model(perturb=False)  # couplings are the identity at initialisation: log s = 0
    batch = make_batch()
    outputs = model(batch)
    z, log_s, log_det = outputs
    assert all(torch.count_nonzero(ls) == 0 for ls in log_s)
    sigma = 0.7
    expected = ((z ** 2).sum() / (2 * sigma ** 2) - sum(log_det)) / z.numel()
    assert WaveGlowLoss(sigma)(outputs, batch).item() == pytest.approx(expected.item(), rel=1e-9)
    # An orthogonal 1x1 conv preserves the norm, so z carries the audio's energy.
    assert (z ** 2).sum().item() == pytest.approx((batch["audio"] ** 2).sum().item(), rel=1e-6)


def test_a_few_adam_steps_lower_the_loss():
    model = make_model(dtype=torch.float32, perturb=False)
    batch = make_batch(dtype=torch.float32)
    criterion = WaveGlowLoss(1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        loss = criterion(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses


def test_infer_gives_audio_of_frames_times_hop_not_clamped():
    model = make_model(dtype=torch.float32)
    audio = model.infer(torch.randn(1, 10, 9), sigma=0.6)
    assert audio.shape == (1, 9 * 16)
    assert torch.isfinite(audio).all()  # as NVIDIA's infer, no clamp (tests/test_parity_waveglow.py: values to 2)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="n_group must be even"):
        WaveGlow(WaveGlowConfig(n_group=7), 10, 16, 64)
    with pytest.raises(ValueError, match="leave 0 channels"):
        WaveGlow(WaveGlowConfig(n_flows=12, n_group=8, n_early_every=2, n_early_size=2), 10, 16, 64)


def test_registered_with_the_contract():
    spec = MODELS["waveglow"]
    assert spec.config_cls is WaveGlowConfig
    assert spec.training.count_items({"audio": torch.zeros(3, 100)}) == 300


@pytest.mark.slow
def test_waveglow_gate_with_inductor(fresh_dynamo):
    """The real compiler on the piece it fuses in every WN layer: add, tanh, sigmoid, product."""
    from modules.waveglow import add_gated_activation
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 50, generator=g, requires_grad=True)
    cond = torch.randn(2, 8, 50, generator=g, requires_grad=True)
    outputs = []
    for gate in (add_gated_activation, torch.compile(add_gated_activation, fullgraph=True, dynamic=False)):
        out = gate(x, cond, 4)
        out.backward(torch.ones_like(out))
        outputs.append((out, x.grad.clone(), cond.grad.clone()))
        x.grad = cond.grad = None
    for a, b in zip(*outputs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    expected = torch.tanh((x + cond)[:, :4]) * torch.sigmoid((x + cond)[:, 4:])
    torch.testing.assert_close(outputs[1][0], expected)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("waveglow", tmp_path_factory.mktemp("waveglow") / "waveglow.pt")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.wav"
    sf.write(path, 0.1 * np.sin(np.arange(4000) / 10.0).astype(np.float32), 22050, subtype="PCM_16")
    return path


@pytest.mark.parametrize("case, message", [
    ("folder", "--output {tmp} is a folder; give a file name ending in .wav"),
    ("no-extension", "--output {tmp}/speech: has no extension; this writes 16-bit PCM WAV only"),
    ("mp3", "--output {tmp}/speech.mp3: has '.mp3'"),
    ("sigma-nan", "--sigma must be a finite number >= 0, got nan"),
    ("short-wav", "samples is shorter than one STFT window"),
    ("nothing", "is a WaveGlow checkpoint: give --mel or --wav"),
])
def test_inference_mistakes_are_one_error_line(capsys, checkpoint, clip, tmp_path, case, message):
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(50, np.float32), 22050, subtype="PCM_16")
    argv = {"folder": ["--wav", str(clip), "--output", str(tmp_path)],
            "no-extension": ["--wav", str(clip), "--output", str(tmp_path / "speech")],
            "mp3": ["--wav", str(clip), "--output", str(tmp_path / "speech.mp3")],
            "sigma-nan": ["--wav", str(clip), "--output", str(tmp_path / "x.wav"), "--sigma", "nan"],
            "short-wav": ["--wav", str(short), "--output", str(tmp_path / "x.wav")],
            "nothing": ["--output", str(tmp_path / "x.wav")]}[case]
    code = inference.main(["--checkpoint", str(checkpoint), "--device", "cpu", *argv])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert message.format(tmp=tmp_path) in errors[0], errors[0]
    assert not (tmp_path / "x.wav").exists()


def test_inference_writes_a_wav_from_a_wav(checkpoint, clip, tmp_path, capsys):
    assert inference.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--wav", str(clip),
                           "--output", str(tmp_path / "x.wav")]) == 0
    assert sf.info(str(tmp_path / "x.wav")).samplerate == 22050


LARGER["waveglow"] = {"wn_channels": 100_000}  # its recorded config: coupling layers 240 GB wide


def test_a_recorded_config_of_layers_240_gb_wide_is_one_line_before_it_is_allocated(tmp_path_factory):
    larger_refused(crafted_outcomes(tmp_path_factory), "waveglow.wn_channels")


def tiny_config(*overrides):
    from parts import config_schemas
    from utils.config import load_config

    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True, overrides=list(overrides))


def test_mels_on_the_device_equal_the_workers_mels(tmp_path):
    """waveglow.mel_on_device: the batch's mels computed in one batched STFT in the step equal those the
    workers compute one crop at a time (float32; tolerance 1e-5 absolute on log-mels of magnitude ~1-10)."""
    from models.waveglow.data import build_datasets, mel_on_device
    from utils.data.datasets import collate_audio_mel

    corpus = synth_corpus(tmp_path / "corpus", n=6)
    batches = {}
    for on_device in (False, True):
        cfg = tiny_config(f"data.dataset_path={corpus}", f"waveglow.mel_on_device={str(on_device).lower()}")
        train_set, _ = build_datasets(cfg)
        train_set.set_epoch(3)
        batches[on_device] = mel_on_device(collate_audio_mel([train_set[i] for i in range(4)]), cfg)
    assert "mel" not in build_datasets(cfg)[0][0]  # the workers' items hold audio only
    assert torch.equal(batches[True]["audio"], batches[False]["audio"])  # the same crops
    assert batches[True]["mel"].shape == batches[False]["mel"].shape
    assert (batches[True]["mel"] - batches[False]["mel"]).abs().max() < 1e-5


@pytest.mark.slow
def test_training_with_mels_on_the_device_takes_the_same_first_step(tmp_path, capsys):
    import train

    corpus = synth_corpus(tmp_path / "corpus", n=6)
    losses = {}
    for on_device in ("false", "true"):
        out = tmp_path / on_device
        assert train.main(["--config", os.path.join(ROOT, "config.json"), "--model", "waveglow", "--tiny",
                           "--max-steps", "2", "--dataset-path", str(corpus), "--output-dir", str(out),
                           "--set", "data.num_workers=0", "--set", "train.log_interval=1",
                           "--set", f"waveglow.mel_on_device={on_device}"]) == 0, capsys.readouterr().err
        losses[on_device] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-4)


@pytest.mark.slow
def test_validation_writes_the_vocoded_and_true_audio_of_a_fixed_utterance_to_tensorboard(tmp_path):
    """At every validation ``audio/vocoded`` (the first validation item's mel through ``WaveGlow.infer``), at the
    first one ``audio/ground_truth``: the first ``frames * hop_length`` samples of the first validation clip."""
    from utils.data.audio import MelSpectrogram

    corpus = synth_corpus(tmp_path / "corpus", n=20)  # 18 train, 2 validation clips: SYN-0019, SYN-0020
    train_with_validation_every_step("waveglow", corpus, tmp_path / "run")
    cfg = tiny_config("audio.mel_framing=nvidia")  # train.py's: WaveGlow's recipe, 1 + segment_length // hop frames
    rate, hop = cfg.audio.sampling_rate, cfg.audio.hop_length
    samples = MelSpectrogram(cfg.audio).num_frames(cfg.waveglow.segment_length) * hop
    assert samples == (cfg.waveglow.segment_length // hop + 1) * hop
    clips = tensorboard_audio(tmp_path / "run")
    assert {"audio/vocoded", "audio/ground_truth"} <= set(clips), list(clips)
    assert [step for step, _, _ in clips["audio/vocoded"]] == [1, 2]
    assert [step for step, _, _ in clips["audio/ground_truth"]] == [1]
    lengths = {"audio/vocoded": samples, "audio/ground_truth": cfg.waveglow.segment_length}  # the crop: a hop fewer
    for tag in ("audio/vocoded", "audio/ground_truth"):
        for step, clip_rate, clip in clips[tag]:
            assert clip_rate == rate and clip.shape == (lengths[tag],), (tag, step, clip_rate, clip.shape)
            assert np.isfinite(clip).all() and np.sqrt(np.mean(clip ** 2)) > 1e-3, (tag, step)
    truth = sf.read(corpus / "wavs" / "SYN-0019.wav", dtype="float32")[0][:cfg.waveglow.segment_length]
    assert np.abs(clips["audio/ground_truth"][0][2] - truth).max() < 2e-4  # 16-bit rounding, twice


@pytest.mark.slow
def test_tiny_trains_on_ljspeech_length_and_short_clips(tmp_path, capsys):
    """``--tiny`` WaveGlow on clips of 6 to 10.2 s (LJSpeech's lengths) and two clips shorter than the tiny
    ``segment_length`` (one of them validates): long clips are cropped, short ones padded, none is left out."""
    import train

    corpus = synth_corpus(tmp_path / "corpus", n=6, seconds=7.5)
    cfg = tiny_config()
    for index, samples in ((1, int(10.2 * 22050)), (2, cfg.waveglow.segment_length // 2),
                           (6, cfg.waveglow.segment_length - 1000)):
        wav = corpus / "wavs" / f"SYN-000{index}.wav"
        audio, rate = sf.read(wav, dtype="float32")
        sf.write(wav, np.resize(audio, samples), rate, subtype="PCM_16")
    out = tmp_path / "out"
    code = train.main(["--config", os.path.join(ROOT, "config.json"), "--model", "waveglow", "--tiny",
                       "--max-steps", "2", "--dataset-path", str(corpus), "--output-dir", str(out),
                       "--set", "data.num_workers=0", "--set", "train.log_interval=1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "5 train / 1 val utterances" in captured.out and "leaving out" not in captured.err
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(json.loads((out / "val_metrics.jsonl").read_text().splitlines()[-1])["val_loss"])


def test_settings_left_null_take_the_recipe():
    """NVIDIA's TacotronSTFT frames, no clipping, cuDNN's autotuner."""
    check_recipe("waveglow", *("nvidia", 0.0, True), optimizer=(1e-4, 0.0))
