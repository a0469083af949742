"""HiFi-GAN: the paper's sizes, output lengths, the loss formulas, both training phases, learning, vocoding."""

import argparse
import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import bound, check_recipe, clean_env, synth_corpus
from test_checkpoint_safety import LARGER, crafted_outcomes, larger_refused
from torch.nn.utils import parametrize

from models import MODELS
from models.hifigan import network as hg
from models.hifigan.data import build_datasets, mel_on_device
from models.hifigan.inference import log_validation, vocode
from modules.hifigan import (Discriminator, Generator, discriminator_loss, feature_matching_loss,
                             generator_adversarial_loss)
from parts import PARTS, SHARED_SECTIONS
from utils.config import ConfigError, build_config, config_from_dict
from utils.data.audio import AudioConfig, MelSpectrogram
from utils.training.recipe import apply_recipe

SPEC = MODELS["hifigan"]

SCHEMAS = {**SHARED_SECTIONS, "hifigan": hg.HiFiGANConfig}
HOP = 256


def config(*overrides, tiny=True):
    """The project's defaults with :data:`TINY_OVERRIDES` and the tiny learning rate as config.json's tiny block would
    apply them, the settings left null HiFi-GAN's recipe's (as ``train.py`` fills them)."""
    raw = {"tiny": {"hifigan": hg.TINY_OVERRIDES, "optimizer": {"lr": 0.001}}}
    return apply_recipe(SPEC, build_config(raw, SCHEMAS, tiny=tiny, overrides=list(overrides)))


def tiny_model(*overrides):
    cfg = config(*overrides)
    torch.manual_seed(0)
    return hg.HiFiGAN(cfg.hifigan, cfg.audio), cfg


def harmonic_batch(cfg, items=2, samples=2048):
    """Two sung vowels: harmonics under a tremolo, and their mels from the shared front end."""
    t = torch.arange(samples) / cfg.audio.sampling_rate
    audio = torch.stack([0.3 * torch.sin(2 * math.pi * f0 * t) * (1 + 0.5 * torch.sin(2 * math.pi * 30 * t))
                         for f0 in (220.0, 330.0)[:items]])
    return {"mel": MelSpectrogram(cfg.audio)(audio), "audio": audio, "ids": ["a", "b"][:items]}


def random_batch(cfg, items=2, samples=2048):
    """Standard normal mels ``(items, n_mels, samples // hop)`` and audio of standard deviation 0.1 (seed 0)."""
    generator = torch.Generator().manual_seed(0)
    mel = torch.randn(items, cfg.audio.n_mels, samples // cfg.audio.hop_length, generator=generator)
    return {"mel": mel, "audio": 0.1 * torch.randn(items, samples, generator=generator), "ids": ["a", "b"][:items]}


def run_phase(nets, phase, batch, freeze_others=True):
    """What the loop does for one phase: freeze the other network, compute the phase's loss, backward."""
    for name, net in nets.items():
        net.zero_grad(set_to_none=True)
        if freeze_others:
            net.requires_grad_(name == phase)
    loss, metrics = hg.train_step(phase, nets, batch)
    loss.backward()
    return loss, metrics


def n_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("version, settings, paper_millions", [
    ("V1", dict(upsample_rates=(8, 8, 2, 2), upsample_kernel_sizes=(16, 16, 4, 4), upsample_initial_channel=512,
                resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=((1, 3, 5),) * 3), 13.92),
    ("V2", dict(upsample_rates=(8, 8, 2, 2), upsample_kernel_sizes=(16, 16, 4, 4), upsample_initial_channel=128,
                resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=((1, 3, 5),) * 3), 0.92),
    ("V3", dict(upsample_rates=(8, 8, 4), upsample_kernel_sizes=(16, 16, 8), upsample_initial_channel=256,
                resblock_kernel_sizes=(3, 5, 7), resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)), resblock=2), 1.46),
])
def test_generator_parameters_match_table_1(version, settings, paper_millions):
    generator = Generator(80, **settings)
    assert n_params(generator) == pytest.approx(paper_millions * 1e6, rel=0.01), (version, n_params(generator))


def test_defaults_are_the_papers_v1():
    cfg = hg.HiFiGANConfig()
    assert (cfg.upsample_rates, cfg.upsample_kernel_sizes, cfg.upsample_initial_channel) == ((8, 8, 2, 2),
                                                                                             (16, 16, 4, 4), 512)
    assert (cfg.resblock, cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes) == (1, (3, 7, 11), ((1, 3, 5),) * 3)
    assert (cfg.mpd_periods, cfg.msd_scales, cfg.segment_length, cfg.batch_size) == ((2, 3, 5, 7, 11), 3, 8192, 16)
    assert (cfg.adam_betas, cfg.lr_decay) == ((0.8, 0.99), 0.999)
    assert (SPEC.recipe["optimizer.lr"], SPEC.recipe["optimizer.weight_decay"]) == (2e-4, 0.01)  # config.json: null
    assert (cfg.mel_loss_weight, cfg.feature_loss_weight) == (45.0, 2.0)
    assert (cfg.loss_fmax, cfg.peak_normalize) == (None, 0.95)  # config_v1's fmax_for_loss null; MelDataset's peak
    v1 = hg.HiFiGAN(cfg, config(tiny=False).audio)  # the audio section shared with Tacotron2 and WaveGlow
    assert v1.generator.loss_settings.audio.fmax == 11025.0 and config(tiny=False).audio.fmax == 8000.0
    assert v1.generator.hop_length == HOP
    audio = v1({"mel": torch.randn(1, 80, 3)})
    assert audio.shape == (1, 3 * HOP)


def test_generator_output_is_frames_times_hop_in_range():
    model, _ = tiny_model()
    mel = 2 * torch.randn(2, 80, 7)
    with torch.no_grad():
        audio = model.generator(mel)
        assert audio.shape == (2, 1, 7 * HOP)
        assert torch.equal(model({"mel": mel}), audio.squeeze(1))
    assert audio.abs().max() <= 1.0 and torch.isfinite(audio).all()


def test_five_period_and_three_scale_discriminators_with_feature_maps():
    disc = Discriminator(mpd_channels=(4, 8, 16, 32, 32), msd_channels=(16, 16, 16, 32, 32, 32, 32)).eval()
    assert [d.period for d in disc.mpd.discriminators] == [2, 3, 5, 7, 11]
    assert len(disc.msd.discriminators) == 3
    norms = [type(d.convs[0].parametrizations.weight[0]).__name__ for d in disc.msd.discriminators]
    assert norms == ["_SpectralNorm", "_WeightNorm", "_WeightNorm"], norms
    assert all(parametrize.is_parametrized(d.convs[0], "weight") for d in disc.mpd.discriminators)
    audio = 0.1 * torch.randn(2, 1, 2048)
    scores, fmaps = disc(audio)
    assert len(scores) == len(fmaps) == 5 + 3
    assert all(s.dim() == 2 and s.shape[0] == 2 for s in scores)
    assert [len(f) for f in fmaps] == [6] * 5 + [8] * 3  # each layer's output, the last one's included
    for period, maps in zip((2, 3, 5, 7, 11), fmaps[:5]):
        assert all(m.shape[-1] == period for m in maps)  # folded (B, C, T / period, period)
    assert [maps[0].shape[-1] for maps in fmaps[5:]] == [2048, 1025, 513]  # raw, pooled once, twice
    scores_2d, _ = disc(audio.squeeze(1))  # (B, T) is taken as (B, 1, T); eval: no power iteration between
    assert all(torch.equal(a, b) for a, b in zip(scores, scores_2d))


def test_losses_have_their_known_values():
    ones, zeros, halves = [torch.ones(2, 5)] * 3, [torch.zeros(2, 5)] * 3, [torch.full((2, 5), 0.5)] * 3
    assert discriminator_loss(ones, zeros).item() == 0.0  # perfect discriminator
    assert discriminator_loss(zeros, ones).item() == pytest.approx(2.0 * 3)  # (0 - 1)^2 + 1^2 per sub-discriminator
    assert discriminator_loss(halves, halves).item() == pytest.approx(0.5 * 3)
    assert generator_adversarial_loss(ones).item() == 0.0  # the generator fools every sub-discriminator
    assert generator_adversarial_loss(zeros).item() == pytest.approx(1.0 * 3)
    assert generator_adversarial_loss(halves).item() == pytest.approx(0.25 * 3)
    real = [[torch.zeros(2, 4, 10), torch.ones(2, 3)], [torch.zeros(2, 7)]]
    assert feature_matching_loss(real, real).item() == 0.0
    shifted = [[r + c for r, c in zip(maps, consts)] for maps, consts in zip(real, [(0.5, -1.0), (2.0,)])]
    assert feature_matching_loss(real, shifted).item() == pytest.approx(0.5 + 1.0 + 2.0)
    cfg = config()
    audio = harmonic_batch(cfg)["audio"]
    assert hg.mel_l1(audio, audio, cfg.audio).item() == 0.0
    noise = 0.3 * torch.randn(2, 2048, generator=torch.Generator().manual_seed(0))  # every mel bin above the floor
    assert hg.mel_l1(0.5 * noise, noise, cfg.audio).item() == pytest.approx(math.log(2), rel=1e-4)  # log-mel shift


def test_discriminator_phase_trains_the_discriminator_only():
    model, cfg = tiny_model()
    nets = hg.networks(model)
    batch = random_batch(cfg)
    loss, metrics = run_phase(nets, "discriminator", batch, freeze_others=False)  # no_grad alone keeps G out
    assert metrics == {} and torch.isfinite(loss) and loss.item() > 0  # train.py logs it as loss_discriminator
    assert all(p.grad is None for p in model.generator.parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.discriminator.parameters())


def test_generator_phase_trains_the_generator_through_the_frozen_discriminator():
    model, cfg = tiny_model()
    nets = hg.networks(model)
    batch = random_batch(cfg)
    loss, metrics = run_phase(nets, "generator", batch)
    assert set(metrics) == {"g_adv", "g_fm", "mel_l1"}
    assert all(torch.isfinite(value) and value.dim() == 0 and not value.requires_grad for value in metrics.values())
    assert loss.item() == pytest.approx(
        (metrics["g_adv"] + 2.0 * metrics["g_fm"] + 45.0 * metrics["mel_l1"]).item(), rel=1e-5)
    assert all(p.grad is None for p in model.discriminator.parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.generator.parameters())
    # The adversarial term alone reaches the generator: its gradient flows back through the frozen discriminator.
    adversarial_only, _ = tiny_model("hifigan.mel_loss_weight=0", "hifigan.feature_loss_weight=0")
    loss, metrics = run_phase(hg.networks(adversarial_only), "generator", batch)
    assert loss.item() == pytest.approx(metrics["g_adv"].item())
    assert sum(p.grad.abs().sum().item() for p in adversarial_only.generator.parameters()) > 0
    with pytest.raises(ValueError, match="unknown phase 'critic'"):
        hg.train_step("critic", nets, batch)


def test_alternating_steps_lower_the_mel_l1():
    """30 discriminator + generator AdamW steps on one fixed batch, driven by hand as the loop would."""
    model, cfg = tiny_model()
    nets = hg.networks(model)
    optimizers = hg.build_optimizer(model, cfg, torch.device("cpu"))
    batch = harmonic_batch(cfg, items=1)
    history = []
    for _ in range(30):
        for phase in hg.PHASES:
            _, metrics = run_phase(nets, phase, batch)
            optimizers[phase].step()
        history.append(metrics["mel_l1"].item())
    assert all(math.isfinite(x) for x in history)
    assert sum(history[-5:]) / 5 < 0.75 * history[0], history


def test_optimizers_and_schedulers():
    model, _ = tiny_model()
    cfg = config(tiny=False)
    optimizers = hg.build_optimizer(model, cfg, torch.device("cpu"))
    assert list(optimizers) == list(hg.PHASES) == list(SPEC.training.phases.names)
    for name, optimizer in optimizers.items():
        assert isinstance(optimizer, torch.optim.AdamW)
        group = optimizer.param_groups[0]
        assert (group["lr"], group["betas"], group["weight_decay"]) == (2e-4, (0.8, 0.99), 0.01)
        assert {id(p) for p in group["params"]} == {id(p) for p in hg.networks(model)[name].parameters()}
        scheduler, unit = hg.build_scheduler(name, optimizer, cfg)
        assert isinstance(scheduler, torch.optim.lr_scheduler.ExponentialLR) and unit == "epoch"
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-4 * 0.999)


@pytest.mark.parametrize("override, message", [
    ("hifigan.upsample_rates=[8,8,2]", "upsample by 128; their product must be audio.hop_length (256)"),
    ("hifigan.segment_length=8000", "hifigan.segment_length (8000) must be a multiple of audio.hop_length (256)"),
    ("hifigan.upsample_kernel_sizes=[16,16,4]", "must be non-empty and of the same length"),
    ("hifigan.upsample_kernel_sizes=[15,16,4,4]", "kernel 15 for rate 8 must be >= the rate and differ"),
    ("hifigan.upsample_initial_channel=8", "halves below 1 channel in 4 upsampling stages; use at least 16"),
    ("hifigan.resblock_kernel_sizes=[3,4]", "must be odd and positive, got [3, 4]"),
    ("hifigan.resblock_dilation_sizes=[[1,3]]", "hifigan.resblock_dilation_sizes (1 lists) must be non-empty"),
    ("hifigan.msd_channels=[16,16,24,32,32,32,32]", "layer 2 (16 -> 24 channels) has 16 groups"),
    ("hifigan.mpd_periods=[]", "hifigan.mpd_periods must be a non-empty list"),
    ("hifigan.loss_fmax=12000", "hifigan.loss_fmax (12000.0 Hz) must lie above audio.fmin (0.0) and at most at"),
])
def test_bad_settings_are_one_line_value_errors(override, message):
    cfg = config(override)
    with pytest.raises(ValueError) as err:
        hg.HiFiGAN(cfg.hifigan, cfg.audio)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_config_bounds_and_the_tiny_block():
    cfg = config()
    assert cfg.hifigan.resblock_dilation_sizes == ((1, 3), (1, 3))  # JSON lists read as the tuples the fields are
    assert cfg.hifigan.mpd_channels == (4, 8, 16, 32, 32)
    assert config_from_dict(json.loads(json.dumps(cfg.to_dict())), SCHEMAS).hifigan == cfg.hifigan  # checkpoints
    for bad in ("hifigan.lr_decay=1.5", "hifigan.adam_betas=[0.8,1.0]", "hifigan.mpd_channels=[4,8,16,32]",
                "hifigan.resblock=3", "hifigan.upsample_rates=[8,0,2,2]"):
        with pytest.raises(ConfigError, match="hifigan"):
            config(bad)


def test_dataset_crops_line_up_with_the_generator(tmp_path):
    corpus = synth_corpus(tmp_path / "corpus", n=6)
    batches = {}
    for on_device in (False, True):
        cfg = config(f"data.dataset_path={corpus}", f"hifigan.mel_on_device={str(on_device).lower()}")
        train_set, val_set = build_datasets(cfg)
        items = [train_set[i] for i in range(2)]
        batches[on_device] = mel_on_device(SPEC.training.collate_fn(items), cfg)
    batch = batches[False]
    assert batch["audio"].shape == (2, 2048) and batch["mel"].shape == (2, 80, 2048 // HOP)
    assert train_set.peak == val_set.peak == 0.95 and float(val_set[0]["audio"].abs().max()) <= 0.95 + 1e-6
    assert (batches[True]["mel"] - batch["mel"]).abs().max() < 1e-5  # the device's batched STFT, the workers' one
    model, _ = tiny_model()
    with torch.no_grad():
        assert model(batch).shape == batch["audio"].shape
    assert SPEC.training.count_items(batch) == 2 * 2048


def test_items_are_peak_normalised_as_jik876s_in_float64(tmp_path):
    """A near-silent 16-bit clip (a few LSBs of noise under a peak of 41 / 32768): the item's audio is jik876's
    ``MelDataset``'s to the bit (``int16 / 32768.0`` in float64, ``librosa.util.normalize`` times 0.95, then float32),
    and so its mel; a float32 scaling rounds some samples one way or the other and moves near-silent mel bins."""
    corpus = synth_corpus(tmp_path / "corpus", n=6)
    rng = np.random.default_rng(1)
    for wav in sorted((corpus / "wavs").glob("*.wav")):
        pcm = rng.integers(-3, 4, size=sf.info(wav).frames).astype(np.int16)
        pcm[100] = 41
        sf.write(wav, pcm, 22050, subtype="PCM_16")
    cfg = config(f"data.dataset_path={corpus}")
    _, val_set = build_datasets(cfg)
    item = val_set[0]
    pcm, _ = sf.read(corpus / "wavs" / f"{item['id']}.wav", dtype="int16")
    theirs = pcm / 32768.0  # float64, as jik876's audio / MAX_WAV_VALUE
    expected = torch.from_numpy((theirs / np.abs(theirs).max() * 0.95).astype(np.float32))[:2048]
    assert torch.equal(item["audio"], expected), (item["audio"] - expected).abs().max()
    assert torch.equal(item["mel"], MelSpectrogram(cfg.audio)(expected))


def test_validation_criterion_is_the_mel_l1():
    cfg = config()
    criterion = SPEC.training.build_criterion(cfg)
    batch = harmonic_batch(cfg)
    assert criterion(batch["audio"], batch).item() == 0.0
    assert criterion(torch.zeros(2, 2048 + HOP), batch).item() > 1.0  # cut to the real length, silence is far off
    assert criterion.audio_cfg.fmax == cfg.audio.sampling_rate / 2  # over the whole band, as jik876's fmax_for_loss


@pytest.mark.skipif("hifigan" not in PARTS.benchmarks, reason="the benchmarks part is left out")
def test_synthetic_batch_and_benchmark_cases():
    cfg = config()
    bench = PARTS.benchmarks["hifigan"]
    batch = bench.synthetic_batch(cfg, 3, torch.Generator().manual_seed(0))
    assert batch["mel"].shape == (3, 80, 8) and batch["audio"].shape == (3, 2048) and len(batch["ids"]) == 3
    with pytest.raises(ValueError, match="multiple of audio.hop_length=256"):
        bench.synthetic_batch(cfg, 1, torch.Generator(), segment_length=1000)
    for case in bench.cases:
        tiny = build_config({}, SCHEMAS, overrides=[*case.overrides, *case.tiny.overrides])
        assert tiny.hifigan.upsample_initial_channel == hg.TINY_OVERRIDES["upsample_initial_channel"]
        assert build_config({}, SCHEMAS, overrides=case.overrides).hifigan.segment_length == 8192


def test_vocode_gives_frames_times_hop_samples_in_range():
    model, cfg = tiny_model()
    model.eval()
    audio = SPEC.inference.vocode(model, torch.randn(80, 9), cfg)
    assert audio.shape == (9 * HOP,) and audio.dtype == torch.float32
    assert audio.abs().max() <= 1.0 and torch.isfinite(audio).all()


def test_infer_writes_the_wav_of_a_mel_file_or_of_a_wavs_mel(tmp_path, capsys):
    model, cfg = tiny_model()
    model.eval()
    torch.save(torch.randn(1, 80, 5), tmp_path / "mel.pt")
    args = argparse.Namespace(mel=str(tmp_path / "mel.pt"), wav=None, output=str(tmp_path / "out.wav"),
                              checkpoint="hifigan.pt")
    assert SPEC.inference.infer(model, cfg, args, torch.device("cpu")) == [tmp_path / "out.wav"]
    info = sf.info(str(tmp_path / "out.wav"))
    assert (info.samplerate, info.frames) == (22050, 5 * HOP)
    sf.write(tmp_path / "clip.wav", harmonic_batch(cfg, items=1)["audio"][0].numpy(), 22050, subtype="PCM_16")
    args = argparse.Namespace(mel=None, wav=str(tmp_path / "clip.wav"), output=str(tmp_path / "copy.wav"),
                              checkpoint="hifigan.pt")
    SPEC.inference.infer(model, cfg, args, torch.device("cpu"))  # copy-synthesis: 2048 samples, 8 frames, 8 * 256 out
    assert sf.info(str(tmp_path / "copy.wav")).frames == 2048
    with pytest.raises(ValueError, match="is a HiFi-GAN checkpoint: give --mel or --wav"):
        SPEC.inference.infer(model, cfg, argparse.Namespace(mel=None, wav=None, output="x.wav",
                                                            checkpoint="hifigan.pt"), torch.device("cpu"))


def test_registered_with_the_multi_optimizer_contract():
    phases = SPEC.training.phases
    assert SPEC.config_cls is hg.HiFiGANConfig and phases.names == ("discriminator", "generator")
    assert phases.networks is hg.networks and phases.train_step is hg.train_step
    assert phases.build_scheduler is hg.build_scheduler and SPEC.training.build_optimizer is hg.build_optimizer
    assert SPEC.training.log_validation is log_validation and SPEC.inference.vocode is vocode
    model, _ = tiny_model()
    assert set(model.state_dict()) == {f"{name}.{key}" for name, net in hg.networks(model).items()
                                       for key in net.state_dict()}  # nothing but the two networks' weights


# --- train.py end to end: 2 gloo processes, the loop's handling of the two phases --------------------------------

# Every training forward of the discriminator or generator takes 0.1 s more: a run slow enough to be signalled.
SLOW = '''
import time, torch
def _slow(module, args, output):
    if type(module).__name__ == "DistributedDataParallel" and module.training:
        time.sleep(0.3)
torch.nn.modules.module.register_module_forward_hook(_slow)
'''
RUN = ["--config", "config.json", "--model", "hifigan", "--tiny", "--set", "train.log_interval=1", "--set",
       "train.val_interval=100", "--set", "train.keep_last=0", "--set", "data.num_workers=1"]


@pytest.fixture(scope="module")
def gan_corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("gan_corpus"), n=20)


def launch(out, corpus, *extra, plant=None):
    import subprocess
    import sys

    from conftest import ROOT, clean_env, planted

    env = clean_env(2)
    if plant is not None:
        planted(out.parent / f"{out.name}_plant", plant, env)
    cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir", str(out) + "_logs", "train.py",
           *RUN, "--dataset-path", str(corpus), "--output-dir", str(out), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def two_ranks(out, corpus, *extra) -> str:
    """What :func:`launch` runs, as 2 gloo ranks of ``train.py``'s ``main`` started by hand (no launcher: the tests
    that use it prove the training, not the launch); rank 0's output once both exited 0 (the test fails otherwise)."""
    import os

    from conftest import ROOT, train_on_ranks

    argv = [*RUN, "--dataset-path", str(corpus), "--output-dir", str(out), *extra]
    argv[argv.index("config.json")] = os.path.join(ROOT, "config.json")
    return train_on_ranks(argv, out.parent / f"{out.name}_ranks", timeout=400)[0]


@pytest.mark.slow
def test_two_processes_train_it_and_every_named_loss_is_logged(gan_corpus, tmp_path):
    # at the full-size mel (80 channels): the halving below is what 60 steps give there
    two_ranks(tmp_path / "out", gan_corpus, "--max-steps", "60", "--set", "audio.n_mels=80", "--set",
              "audio.win_length=1024")
    logged = rows(tmp_path / "out")
    assert [r["step"] for r in logged] == list(range(1, 61))
    names = {"loss_discriminator", "loss_generator", "grad_norm_discriminator", "grad_norm_generator", "g_adv",
             "g_fm", "mel_l1"}
    assert all(set(r["losses"]) == names for r in logged)
    first, last = (sum(r["losses"]["mel_l1"] for r in part) / 10 for part in (logged[:10], logged[-10:]))
    assert last < 0.5 * first, (first, last)
    assert all(r["loss"] == r["losses"]["loss_generator"] for r in logged)  # `loss`: the last phase's


@pytest.mark.slow
def test_a_sigterm_and_resume_end_equal_to_an_uninterrupted_run(gan_corpus, tmp_path):
    """A run of 2 ranks launched by ``multiproc.py`` and sent SIGTERM mid-way stops with a checkpoint; resumed, it
    ends equal to an uninterrupted run (that one and the resumed one: 2 ranks started by hand, :func:`two_ranks`)."""
    import os
    import signal
    import time

    from conftest import finish

    steps = ["--max-steps", "12", "--set", "train.checkpoint_interval=100"]
    two_ranks(tmp_path / "ref", gan_corpus, *steps)  # the launcher is what the stopped run tests
    stopped = tmp_path / "stopped"
    proc = launch(stopped, gan_corpus, *steps, plant=SLOW)
    deadline = time.monotonic() + bound(100)
    while not ((stopped / "metrics.jsonl").exists() and any(r["step"] >= 5 for r in rows(stopped))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc, timeout=200)
    at = torch.load(stopped / "checkpoint_last.pt", weights_only=True)["step"]
    assert code == 0 and "stopped at step" in output and 5 <= at < 12, output
    output = two_ranks(stopped, gan_corpus, *steps)
    assert f"at step {at}" in output, output
    ref, got = (torch.load(p / "checkpoint_last.pt", weights_only=True) for p in (tmp_path / "ref", stopped))
    assert ref["step"] == got["step"] == 12 and ref["epoch"] == got["epoch"] and ref["epoch"] >= 2
    for key in ref["model"]:
        assert (ref["model"][key] - got["model"][key]).abs().max() <= 1e-6, key
    assert set(ref["optimizer"]) == set(ref["scheduler"]) == {"discriminator", "generator"}
    for name in ("discriminator", "generator"):
        assert ref["scheduler"][name] == got["scheduler"][name]
        per_epoch = (18 // 2) // 2  # 18 training clips (2 validate), 2 ranks, batch 2 (drop_last)
        ended = ref["epoch"] + (ref["batch_in_epoch"] == per_epoch)  # the last batch read closes an epoch
        assert ref["scheduler"][name]["last_epoch"] == ended == 3  # ExponentialLR stepped once per epoch
        for a, b in zip(ref["optimizer"][name]["state"].values(), got["optimizer"][name]["state"].values()):
            for key in a:
                assert (a[key] - b[key]).abs().max() <= 1e-6, (name, key)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.slow
def test_mixed_precision_runs_without_a_non_finite_loss(gan_corpus, tmp_path, precision):
    two_ranks(tmp_path / "out", gan_corpus, "--max-steps", "10", "--set", f"train.precision={precision}", "--set",
              "train.on_nonfinite=stop")
    logged = rows(tmp_path / "out")
    assert len(logged) == 10 and all(math.isfinite(r["loss"]) for r in logged)
    assert all(math.isfinite(v) for r in logged for k, v in r["losses"].items() if not k.startswith("grad_norm"))
    assert "fp16_overflows" in logged[-1]  # steps the GradScaler skipped are counted, not hidden


def test_inference_writes_the_wav_of_a_mel(tmp_path):
    """``inference.py --checkpoint hifigan.pt --mel mel.pt`` (its command line in this process)."""
    from conftest import run_main, tiny_checkpoint

    voc = tiny_checkpoint("hifigan", tmp_path / "hifigan.pt")
    audio = AudioConfig(**torch.load(voc, weights_only=True)["config"]["audio"])  # the tiny block's mel size
    mel = MelSpectrogram(audio)(torch.randn(1, 256 * 20) * 0.1)[0]
    torch.save(mel, tmp_path / "mel.pt")
    run_main("inference", "--checkpoint", str(voc), "--mel", str(tmp_path / "mel.pt"), "--output",
             str(tmp_path / "a.wav"), "--device", "cpu")  # fails the test unless it exits 0
    assert sf.info(str(tmp_path / "a.wav")).frames == mel.shape[-1] * 256


LARGER["hifigan"] = {"upsample_initial_channel": 100_000}  # its recorded config: a generator of 900 GB


def test_a_recorded_config_of_a_900_gb_generator_is_one_line_before_it_is_allocated(tmp_path_factory):
    larger_refused(crafted_outcomes(tmp_path_factory), "hifigan.upsample_initial_channel")


@pytest.mark.slow
def test_validation_writes_the_generated_and_true_audio_of_a_fixed_utterance_to_tensorboard(tmp_path):
    """At every validation ``audio/vocoded`` (the generator's output for the first validation crop), at the first
    one ``audio/ground_truth`` (that crop: the first ``segment_length`` samples of the first validation clip)."""
    from conftest import tensorboard_audio, train_with_validation_every_step

    corpus = synth_corpus(tmp_path / "corpus", n=20)  # 18 train, 2 validation clips: SYN-0019, SYN-0020
    train_with_validation_every_step("hifigan", corpus, tmp_path / "run")
    cfg = config()
    samples = cfg.hifigan.segment_length
    clips = tensorboard_audio(tmp_path / "run")
    assert [step for step, _, _ in clips["audio/vocoded"]] == [1, 2]
    assert [step for step, _, _ in clips["audio/ground_truth"]] == [1]
    for tag in ("audio/vocoded", "audio/ground_truth"):
        for step, rate, clip in clips[tag]:
            assert rate == cfg.audio.sampling_rate and clip.shape == (samples,), (tag, step, clip.shape)
            assert np.isfinite(clip).all() and np.abs(clip).max() > 0, (tag, step)
    truth = sf.read(corpus / "wavs" / "SYN-0019.wav", dtype="float32")[0]
    truth = (truth * (cfg.hifigan.peak_normalize / np.abs(truth).max()))[:samples]  # the clip at its training peak
    assert np.abs(clips["audio/ground_truth"][0][2] - truth).max() < 2e-4  # 16-bit rounding, twice


REFUSED = [
    ("optimizer.schedule=cosine", "optimizer.schedule=cosine, optimizer.warmup_steps=0: model 'hifigan' builds its "
                                  "own LR schedulers (Phases.build_scheduler), which these settings would not change"),
    ("optimizer.warmup_steps=100", "optimizer.schedule=constant, optimizer.warmup_steps=100: model 'hifigan' builds "
                                   "its own"),
    *([("train.parallelism=fsdp", "train.parallelism=fsdp with model 'hifigan', which trains several optimizers")]
      if PARTS.run.sharding is not None else []),  # the sharding part's setting, where the project has it
]
"""Settings a model with several optimizers cannot honour, and the start of the error line that refuses each."""


@pytest.mark.parametrize("setting, message", REFUSED)
def test_what_it_cannot_honour_is_refused_in_one_line_before_any_data_is_read(tmp_path, setting, message):
    """The first setting in a ``python train.py`` process of its own (its exit status, its stderr, its time from
    start to refusal); the others, whose refusal differs only in its line, through ``train.main`` in this process."""
    import subprocess
    import sys
    import time

    from conftest import ROOT, bound, run_train_main

    argv = [*RUN, "--set", setting, "--dataset-path", str(tmp_path / "no_corpus_here"), "--output-dir",
            str(tmp_path / "out")]
    start = time.monotonic()
    if setting == REFUSED[0][0]:
        done = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, env=clean_env(1), capture_output=True,
                              text=True, timeout=300)
        code, stderr = done.returncode, done.stderr
    else:
        code, _, stderr = run_train_main(argv)
    took = time.monotonic() - start
    assert code == 1 and stderr.startswith(f"ERROR: {message}"), stderr
    assert len(stderr.splitlines()) == 1 and took < bound(5, 1), (took, stderr)
    assert not (tmp_path / "out").exists()  # refused before the output folder, the process group, the corpus


def test_settings_left_null_take_the_recipe():
    """jik876's frames, no clipping, cuDNN's autotuner."""
    check_recipe("hifigan", *("jik876", 0.0, True), optimizer=(2e-4, 0.01))
