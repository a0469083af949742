"""Matcha-TTS as the project runs it: its data and collate, its mel statistics, training on 2 gloo ranks (the three
losses logged, the statistics recorded), and ``inference.py`` (a wav in a speaker's voice from seeded noise, and each
mistake one ``ERROR:`` line)."""

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter
from conftest import (ROOT, check_recipe, demo_corpus, made_once, run_main, run_train_main, tensorboard_audio,
                      tiny_checkpoint, train_on_ranks)

import inference
import train
from model import BatchFrames
from models import MODELS
from models.matcha import text
from models.matcha.data import MatchaCollate, MatchaDataset, mel_statistics
from models.matcha.inference import synthesise
from models.matcha.validation import synthesised_mel
from parts import config_schemas
from utils.config import load_config
from utils.data.corpora import load_splits
from utils.training.recipe import apply_recipe

SPEAKERS = ["p225", "p226", "p227"]


def tiny_cfg(speakers=(), stats=(-6.0, 2.5)):
    cfg = apply_recipe(MODELS["matcha"], load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True))
    cfg.data.speakers = list(speakers)
    cfg.matcha.mel_mean, cfg.matcha.mel_std = stats
    return cfg


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    """An untrained tiny checkpoint of :data:`SPEAKERS`, as train.py saves one (its config records the statistics)."""
    cfg = tiny_cfg(SPEAKERS)
    torch.manual_seed(0)
    model = MODELS["matcha"].build_model(cfg)
    path = tmp_path_factory.mktemp("matcha") / "voices.pt"
    torch.save({"model": model.state_dict(), "model_name": "matcha", "config": cfg.to_dict(), "step": 0}, path)
    return path


def test_settings_left_null_take_the_recipe():
    """The authors' HiFi-GAN (jik876) frames, gradient_clip_val 5.0, Adam 1e-4 without weight decay; frame budgets;
    ours: an EMA of the weights at 0.999 (the authors' recipe, ``train.ema_decay=0``, keeps none)."""
    check_recipe("matcha", *("jik876", 5.0, False), optimizer=(1e-4, 0.0),
                 batching={"data.batching": "frames", "data.max_frames": BatchFrames(870)}, ema=0.999)


def test_the_default_config_batches_by_frame_budgets_of_its_batch_size_full_size_and_tiny():
    """config.json as it ships: Matcha-TTS batches by padded mel frames, as many as its ``batch_size`` clips of
    LJSpeech's longest (870 frames: 27,840 at full size, 1,740 tiny); the project's other models keep batches of
    ``batch_size``; a value given keeps its meaning."""
    config = os.path.join(ROOT, "config.json")
    for tiny, frames in ((False, 32 * 870), (True, 2 * 870)):
        cfg = train.load_run_config(train.parse_args(["--config", config, "--model", "matcha", *(["--tiny"] if tiny else [])]))
        assert (cfg.data.batching, cfg.data.max_frames) == ("frames", frames) == ("frames", 870 * cfg.matcha.batch_size)
    for name in set(MODELS) - {"matcha"}:
        cfg = train.load_run_config(train.parse_args(["--config", config, "--model", name]))
        assert (cfg.data.batching, cfg.data.max_frames) == ("random", 0), name
    cfg = train.load_run_config(train.parse_args(["--config", config, "--model", "matcha", "--set",
                                                  "data.batching=buckets", "--set", "data.max_frames=5000"]))
    assert (cfg.data.batching, cfg.data.max_frames) == ("buckets", 5000)


def test_items_are_phoneme_ids_and_normalised_mels_padded_to_frames_the_unet_halves(tmp_path_factory):
    corpus = demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)
    names = ["19", "26"]  # the demo filelists' first two speakers
    cfg = tiny_cfg(names)
    cfg.data.dataset_path = str(corpus)
    train, _ = load_splits(cfg.data)
    raw = MatchaDataset(train, cfg.audio, None, "training", cfg.data.speakers)
    mean, std = mel_statistics(raw)
    values = torch.cat([raw.mel(i).flatten() for i in range(len(raw))]).double()
    assert mean == pytest.approx(float(values.mean()), abs=1e-6) and std == pytest.approx(float(values.std(correction=0)), 1e-6)
    normal = MatchaDataset(train, cfg.audio, (mean, std), "training", cfg.data.speakers)
    items = [normal[i] for i in range(len(normal))]
    assert items[0]["text"].tolist() == text.text_to_ids(train[0].text)
    torch.testing.assert_close(items[0]["mel"], (raw.mel(0) - mean) / std)
    assert [item["mel"].shape[1] for item in items] == normal.lengths()
    batch = MatchaCollate()(items)
    frames = max(normal.lengths())
    assert batch["mel"].shape == (len(items), 40, -(-frames // 4) * 4) and batch["speaker"].tolist() == [
        names.index(name) for name in train.speaker.tolist()]
    for i, item in enumerate(items):
        assert batch["mel"][i, :, item["mel"].shape[1]:].abs().sum() == 0
        assert batch["text"][i, :batch["text_lengths"][i]].tolist() == item["text"].tolist()


def test_the_statistics_script_prints_the_training_splits_and_names_a_missing_corpus(tmp_path_factory, tmp_path):
    corpus = demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)
    config = os.path.join(ROOT, "config.json")
    said = run_main("scripts.mel_statistics", "--config", config, "--dataset-path", str(corpus), "--tiny")
    cfg = tiny_cfg()
    cfg.data.dataset_path = str(corpus)
    expected = mel_statistics(MatchaDataset(load_splits(cfg.data)[0], cfg.audio))
    assert json.loads(said.stdout) == pytest.approx(dict(zip(("mel_mean", "mel_std"), expected)), abs=1e-6)
    missing = run_main("scripts.mel_statistics", "--config", config, "--dataset-path", str(tmp_path / "nowhere"),
                       check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("ERROR: ") and len(missing.stderr.splitlines()) == 1
    assert str(tmp_path / "nowhere") in missing.stderr and "Traceback" not in missing.stderr


def test_training_without_the_phonemizer_is_one_error_line_before_the_run_starts(tmp_path_factory, tmp_path,
                                                                               monkeypatch):
    corpus = demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)
    monkeypatch.setattr(text, "phonemizer", None)
    monkeypatch.setattr(text, "_BACKEND", [])
    code, out, err = run_train_main(["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny",
                                     "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"), "--set",
                                     "data.num_workers=0"])
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and "Traceback" not in err and errors == [
        f"ERROR: rank 0: the Matcha-TTS text front end needs phonemizer and espeak-ng: {text.INSTALL}"], err
    assert not list((tmp_path / "out").glob("checkpoint_*"))


VAL_SECONDS = 0.1
"""``matcha.val_audio_seconds`` of the validation tests: 8 frames of 256 samples at 22050 Hz."""


def two_rank_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """Tiny Matcha-TTS trained 2 steps on 2 gloo ranks on a 4-voice demo corpus in bf16 (filelists of
    ``path|speaker|text``, found by ``data.format=auto``), its statistics and EMA decay left null (the recipe's), its validation audio
    (:data:`VAL_SECONDS`) through a tiny HiFi-GAN checkpoint (``matcha.val_vocoder``) where the project has the model,
    made once per session: ``(output folder, each rank's output)``; no caller may change it."""
    corpus = demo_corpus(tmp_path_factory, "filelist", speakers=4, n=8)

    def make(folder):
        argv = ["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny", "--max-steps", "2",
                "--dataset-path", str(corpus), "--output-dir", str(folder / "out"), "--set", "data.num_workers=0",
                "--set", "data.val_size=2", "--set", "train.val_interval=2", "--set", "train.log_interval=1",
                "--set", "train.precision=bf16", "--set", f"matcha.val_audio_seconds={VAL_SECONDS}"]
        if "hifigan" in MODELS:  # its validation audio through a HiFi-GAN checkpoint
            argv += ["--set", f"matcha.val_vocoder={tiny_checkpoint('hifigan', folder / 'hifigan.pt')}"]
        return train_on_ranks(argv, folder / "ranks")
    folder, said = made_once(tmp_path_factory, "matcha_run", make)
    return folder / "out", said


@pytest.fixture(scope="module")
def matcha_run(tmp_path_factory):
    """:func:`two_rank_run`."""
    return two_rank_run(tmp_path_factory)


@pytest.mark.slow
def test_training_on_two_ranks_in_bf16_logs_the_three_losses_keeps_an_ema_and_records_the_statistics(matcha_run,
                                                                                                     tmp_path):
    """bf16 on the CPU: finite losses; the recipe's EMA saved, validated with (its alignment drawn) and spoken with."""
    out, said = matcha_run
    assert "batches of up to 1740 padded mel frames (data.batching=frames)" in said[0], said[0][-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and all(set(row["losses"]) == {"prior", "duration", "flow"}
                                                            for row in rows)
    for row in rows:
        assert np.isfinite([row["loss"], *row["losses"].values()]).all()
        assert row["loss"] == pytest.approx(sum(row["losses"].values()), rel=1e-5)
    saved = torch.load(out / "checkpoint_last.pt", weights_only=True)
    config = saved["config"]
    assert (config["train"]["precision"], config["train"]["ema_decay"]) == ("bf16", 0.999)
    assert saved["ema"] and set(saved["ema"]) <= set(saved["model"]) and (out / "alignment_2.png").is_file()
    assert config["matcha"]["mel_std"] > 0 and -12 < config["matcha"]["mel_mean"] < 0, config["matcha"]
    found = text.versions()
    assert (config["matcha"]["phonemizer"], config["matcha"]["espeak_ng"]) == (found["phonemizer"], found["espeak-ng"])
    assert json.loads((out / "speakers.json").read_text()) == {"19": 0, "26": 1, "27": 2, "32": 3}
    spoken = run_main("inference", "--checkpoint", str(out / "checkpoint_last.pt"), "--device", "cpu", "--text",
                      "Hello world.", "--speaker", "27", "--output", str(tmp_path / "hello.wav"))
    assert "is run with the EMA weights of step 2 (train.ema_decay=0.999)" in spoken.stderr
    assert sf.info(str(tmp_path / "hello.wav")).frames > 0


def test_inference_speaks_a_speaker_from_seeded_noise(voices, tmp_path):
    """Same ``--seed``: the same wav; another seed or speaker: another."""
    def speak(name, *options):
        run_main("inference", "--checkpoint", str(voices), "--device", "cpu", "--text", "Hello world.",
                 "--output", str(tmp_path / name), "--n-timesteps", "2", *options)
        audio, rate = sf.read(str(tmp_path / name))
        assert rate == 22050 and audio.size > 0
        return audio

    first = speak("a.wav", "--speaker", "p226", "--seed", "1")
    assert np.array_equal(first, speak("b.wav", "--speaker", "p226", "--seed", "1"))
    assert not np.array_equal(first, speak("c.wav", "--speaker", "p226", "--seed", "2"))
    assert not np.array_equal(first, speak("d.wav", "--speaker", "p225", "--seed", "1"))


def test_the_noise_scales_with_the_temperature_and_the_frames_with_the_length_scale():
    """Temperature 0: no noise, the same mel whatever the seed; the durations times ``length_scale``; the mel
    de-normalised by the recorded statistics."""
    cfg = tiny_cfg(SPEAKERS, stats=(-6.0, 2.5))
    torch.manual_seed(0)
    model = MODELS["matcha"].build_model(cfg).eval()
    speaker = torch.tensor([1])

    def mel(seed, how):
        torch.manual_seed(seed)
        return synthesise(model, cfg, "Hello world.", speaker, how)

    cold = mel(1, (2, 0.0, 1.0))
    assert torch.equal(cold, mel(2, (2, 0.0, 1.0))) and not torch.equal(mel(1, (2, 0.667, 1.0)), cold)
    assert not torch.equal(mel(1, (3, 0.0, 1.0)), cold) and mel(1, (2, 0.0, 2.0)).shape[1] == 2 * cold.shape[1]
    ids = torch.tensor([text.text_to_ids("Hello world.")])
    out = model.synthesise(ids, torch.tensor([ids.shape[1]]), 2, 0.0, speaker)
    torch.testing.assert_close(cold, out["decoder_out"][0, :, :cold.shape[1]] * 2.5 - 6.0)


@pytest.mark.parametrize("options, message", [
    (["--speaker", "nobody"], "--speaker nobody is not a speaker of {ckpt}; its speakers: p225, p226, p227"),
    ([], "{ckpt} speaks 3 voices: give --speaker NAME (p225, p226, p227)"),
    (["--speaker", "p225", "--n-timesteps", "0"], "--n-timesteps 0: the decoder needs at least 1 Euler step"),
    (["--speaker", "p225", "--text", "..."], "the text '...' phonemizes to nothing"),
    (["--speaker", "p225", "--text", "   "], "is a Matcha-TTS checkpoint: give --text, the sentence to speak"),
    (["--speaker", "p225", "--no-phonemizer"], "needs phonemizer and espeak-ng: pip install phonemizer"),
])
def test_inference_mistakes_are_one_error_line(capsys, monkeypatch, voices, tmp_path, options, message):
    if "--no-phonemizer" in options:
        options = [option for option in options if option != "--no-phonemizer"]
        monkeypatch.setattr(text, "phonemizer", None)
        monkeypatch.setattr(text, "_BACKEND", [])
    argv = ["--checkpoint", str(voices), "--device", "cpu", "--text", "Hello.", "--output", str(tmp_path / "x.wav")]
    code = inference.main([*argv, *options])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert message.format(ckpt=voices) in errors[0], errors[0]
    assert not (tmp_path / "x.wav").exists()


def test_a_checkpoint_phonemized_by_other_versions_is_said_in_one_warning_line(tmp_path):
    cfg = tiny_cfg(SPEAKERS)
    cfg.matcha.phonemizer, cfg.matcha.espeak_ng = "0.1", "1.0"
    torch.manual_seed(0)
    path = tmp_path / "old.pt"
    torch.save({"model": MODELS["matcha"].build_model(cfg).state_dict(), "model_name": "matcha",
                "config": cfg.to_dict(), "step": 0}, path)
    found = text.versions()
    line = (f"the model was trained on the phonemes of phonemizer 0.1 and espeak-ng 1.0, these are of "
            f"{found['phonemizer']} and {found['espeak-ng']}: they may differ")
    with pytest.warns(UserWarning) as said:
        run_main("inference", "--checkpoint", str(path), "--device", "cpu", "--text", "Hello.", "--speaker", "p225",
                 "--n-timesteps", "1", "--output", str(tmp_path / "x.wav"))
    assert [str(warning.message) for warning in said if "phonemes of" in str(warning.message)] == [line]


def test_a_checkpoint_without_the_statistics_is_one_error_line(capsys, tmp_path):
    checkpoint = tiny_checkpoint("matcha", tmp_path / "bare.pt")
    code = inference.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--text", "Hello.", "--output",
                           str(tmp_path / "x.wav")])
    err = capsys.readouterr().err
    assert code == 1 and f"ERROR: {checkpoint} records no matcha.mel_mean or mel_std" in err and "Traceback" not in err


def test_text_to_speech_through_a_hifigan_checkpoint(voices, tmp_path):
    """``matcha_hifigan``: ``inference.py --text ... --speaker ... --vocoder HIFIGAN.pt``, Matcha's mel vocoded by the
    other checkpoint."""
    if "hifigan" not in MODELS:
        pytest.skip("this project has no hifigan model to chain")
    vocoder = tiny_checkpoint("hifigan", tmp_path / "hifigan.pt")
    run_main("inference", "--checkpoint", str(voices), "--text", "Hello there.", "--speaker", "p225", "--vocoder",
             str(vocoder), "--output", str(tmp_path / "t.wav"), "--device", "cpu", "--n-timesteps", "2")
    info = sf.info(str(tmp_path / "t.wav"))
    assert info.samplerate == 22050 and info.frames > 0 and info.frames % 256 == 0


def validation_inputs():
    """``(cfg, model, batch, outputs)``: the tiny config with :data:`VAL_SECONDS` of validation audio, an untrained
    tiny Matcha-TTS in eval mode, a batch of two utterances of random text and mels, and the model's outputs for it."""
    cfg = tiny_cfg()
    cfg.matcha.val_audio_seconds = VAL_SECONDS
    model = MODELS["matcha"].build_model(cfg).eval()
    generator = torch.Generator().manual_seed(0)
    items = [{"text": torch.randint(1, 100, (n,), generator=generator), "mel": torch.randn(40, 24 - n, generator=generator),
              "id": f"utt{n}"} for n in (9, 7)]
    batch = MatchaCollate()(items)
    with torch.no_grad():
        return cfg, model, batch, model(batch)


def test_validation_draws_the_alignment_and_the_synthesised_mel_beside_its_target_and_adds_their_audio(tmp_path):
    """Rank 0's validation media (``models.matcha.validation``), read back from TensorBoard: the MAS path and the mels
    as figures at every validation, Griffin-Lim clips of ``matcha.val_audio_seconds`` (the target's once), the
    sampler's mel the same at every call and the run's random stream left as it was."""
    cfg, model, batch, outputs = validation_inputs()
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    state = torch.random.get_rng_state()
    for step in (2, 4):
        MODELS["matcha"].training.log_validation(model, batch, outputs, step, writer, tmp_path, cfg=cfg)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(synthesised_mel(model, batch, cfg), synthesised_mel(model, batch, cfg))
    writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "audio": 0})
    events.Reload()
    assert {tag: [event.step for event in events.Images(tag)] for tag in events.Tags()["images"]} == {
        "alignment": [2, 4], "mel": [2, 4]}
    assert {tag: [event.step for event in events.Audio(tag)] for tag in events.Tags()["audio"]} == {
        "audio/target_griffin_lim": [2], "audio/synthesised_griffin_lim": [2, 4]}
    assert (tmp_path / "alignment_2.png").is_file() and (tmp_path / "alignment_4.png").is_file()
    frames = min(8, synthesised_mel(model, batch, cfg).shape[1])
    for tag, length in (("audio/target_griffin_lim", 8 * 256), ("audio/synthesised_griffin_lim", frames * 256)):
        clip, _ = sf.read(io.BytesIO(events.Audio(tag)[0].encoded_audio_string))
        assert len(clip) == length and np.abs(clip).max() > 0, tag


def test_validation_audio_through_a_vocoder_checkpoint_is_its_generator_on_the_same_mels(tmp_path):
    """``matcha.val_vocoder``'s vocoder, loaded as a run loads it (``inference.load_vocoder``), makes the validation
    clips in Griffin-Lim's place, tagged with its name: each the HiFi-GAN generator's audio of the same crop of the
    target's and the sampler's de-normalised mels (16-bit PCM in TensorBoard: within 2 steps of 1/32767)."""
    if "hifigan" not in MODELS:
        pytest.skip("this project has no hifigan model to vocode with")
    cfg, model, batch, outputs = validation_inputs()
    path = tiny_checkpoint("hifigan", tmp_path / "hifigan.pt")
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    vocoder = inference.load_vocoder(str(path), torch.device("cpu"))
    for step in (2, 4):
        MODELS["matcha"].training.log_validation(model, batch, outputs, step, writer, tmp_path, cfg=cfg,
                                                 vocoder=vocoder)
    writer.close()
    clips = tensorboard_audio(tmp_path)
    assert {tag: [step for step, _, _ in found] for tag, found in clips.items()} == {
        "audio/target_hifigan": [2], "audio/synthesised_hifigan": [2, 4]}
    _, hifigan, _ = inference.load_trained(path, torch.device("cpu"))
    mean, std, frames = cfg.matcha.mel_mean, cfg.matcha.mel_std, int(batch["mel_lengths"][0])
    mels = {"audio/target_hifigan": batch["mel"][0, :, :frames] * std + mean,
            "audio/synthesised_hifigan": synthesised_mel(model, batch, cfg) * std + mean}
    for tag, mel in mels.items():
        with torch.no_grad():
            expected = hifigan.generator(mel[None, :, :8])[0, 0].clamp(-1, 1).numpy()
        for _, rate, clip in clips[tag]:
            assert rate == 22050 and clip.shape == expected.shape == (min(8, mel.shape[1]) * 256,), tag
            np.testing.assert_allclose(clip, expected, atol=2 / 32767, rtol=0, err_msg=tag)
        assert np.abs(expected).max() > 100 / 32767, tag  # audible: not a comparison of near-silences


def bad_vocoder(case, tmp_path):
    """``(path, what the line says of it)``: a file ``matcha.val_vocoder`` cannot name, of each kind."""
    path = tmp_path / f"{case}.pt"
    if case == "missing":
        return path, f"checkpoint not found: {path}"
    if case == "not a vocoder":
        return tiny_checkpoint("matcha", path), f"{path} holds a 'matcha' model, which is not a vocoder"
    if case == "a bare generator":  # jik876's g_ file, not imported: no model entry
        torch.save({"generator": {"conv_pre.bias": torch.zeros(4)}}, path)
        return path, f"{path} is not a checkpoint of this project (no 'model' entry)"
    cfg = apply_recipe(MODELS["hifigan"], load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True))
    cfg.audio.sampling_rate, cfg.audio.n_mels = 16000, 80  # a vocoder of other mels than the tiny run's
    torch.save({"model": MODELS["hifigan"].build_model(cfg).state_dict(), "model_name": "hifigan",
                "config": cfg.to_dict(), "step": 0}, path)
    return path, (f"{path} is a vocoder of other audio settings than the run's: sampling_rate 16000, the mels' 22050; "
                  "n_mels 80, the mels' 40")


@pytest.mark.parametrize("case", ["missing", "not a vocoder", "a bare generator", "other audio settings"])
def test_a_bad_validation_vocoder_is_one_error_line_at_the_start_before_any_step(tmp_path_factory, tmp_path, case):
    """Rank 0 loads ``matcha.val_vocoder`` first thing in the run (``build_run``): a file it cannot vocode with stops
    the run there, one ``ERROR:`` line naming the key, the file and what is wrong; no step, no checkpoint."""
    if "hifigan" not in MODELS:
        pytest.skip("this project has no vocoder model: the key is refused before any file is read (test below)")
    path, what = bad_vocoder(case, tmp_path)
    out = tmp_path / "out"
    code, _, err = run_train_main(["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny",
                                   "--dataset-path", str(demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)),
                                   "--output-dir", str(out), "--set", "data.num_workers=0", "--set",
                                   f"matcha.val_vocoder={path}"])
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and errors == [f"ERROR: rank 0: matcha.val_vocoder: {what}"] and "Traceback" not in err, err
    assert not out.exists() or not list(out.iterdir()), list(out.iterdir())


def test_a_validation_vocoder_in_a_project_without_a_vocoder_model_is_refused_before_any_rank_starts(
        monkeypatch, tmp_path_factory, tmp_path):
    """``example_model=matcha``: ``matcha.val_vocoder`` names a file no model of the registry can load, one line
    from ``multiproc.py``'s preflight (``check_command_line``) and from ``train.py`` before its process group."""
    registry = {name: spec for name, spec in MODELS.items() if not (spec.inference and spec.inference.vocode)}
    monkeypatch.setattr(train, "MODELS", registry)
    path = tiny_checkpoint("hifigan", tmp_path / "hifigan.pt") if "hifigan" in MODELS else tmp_path / "hifigan.pt"
    argv = ["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny", "--dataset-path",
            str(demo_corpus(tmp_path_factory, "filelist", speakers=2, n=4)), "--output-dir", str(tmp_path / "out"),
            "--set", f"matcha.val_vocoder={path}"]
    line = (f"matcha.val_vocoder={path}: this project has no vocoder model to load it as (models: "
            f"{', '.join(registry)}); leave it null for Griffin-Lim's validation audio")
    assert train.check_command_line(argv) == line
    code, _, err = run_train_main(argv)
    assert code == 1 and err.splitlines() == [f"ERROR: {line}"] and not (tmp_path / "out").exists(), err


@pytest.mark.slow
def test_the_run_on_two_ranks_vocodes_its_validation_audio_with_the_vocoder_it_names(matcha_run):
    """``matcha.val_vocoder`` through the run's wiring (rank 0 loads it at the start, its validator hands it to the
    model's hook): the clips of the shared run are the HiFi-GAN checkpoint's, tagged with its name (Griffin-Lim's
    where the project has no vocoder model), :data:`VAL_SECONDS` long at most."""
    out, _ = matcha_run
    name = "hifigan" if "hifigan" in MODELS else "griffin_lim"
    clips = tensorboard_audio(out)
    assert {tag: [step for step, _, _ in found] for tag, found in clips.items()} == {
        f"audio/target_{name}": [2], f"audio/synthesised_{name}": [2]}
    for tag, [(_, rate, clip)] in clips.items():
        assert rate == 22050 and 0 < len(clip) <= 8 * 256 and len(clip) % 256 == 0 and np.isfinite(clip).all(), tag
