"""A vocoder fine-tuned on Tacotron2's teacher-forced ("ground-truth aligned") mels: ``scripts.dump_gta_mels`` on
two ranks, the frame rule of every file it writes, ``data.mel_dir`` in :class:`utils.data.mel_dir.MelDirDataset`
(audio and mel cropped together on frame boundaries) and a vocoder whose loss falls on those mels.

The fast tests run the script in this process (one rank) and the dataset directly; the ``slow`` ones launch the
script on 2 processes with ``multiproc.py`` and train the project's vocoder with ``train.py``."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import soundfile as sf
import torch
from conftest import (LAUNCHER_PREFIXES, LAUNCHER_VARS, ROOT, bound, finish, made_once, reframed_checkpoint,
                      shared_corpus, start_job, synth_corpus, tiny_checkpoint, train_in_process, train_on_ranks)

import train
from models import MODELS
from parts import PARTS, config_schemas
from scripts import dump_gta_mels
from utils.config import load_config
from utils.data.audio import MelSpectrogram, load_wav
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus, DataError, Utterance
from utils.data.datasets import Crop
from utils.data.mel_dir import MEL_SETTINGS_FILE, SILENCE_LOG_MEL, MelDirDataset
from utils.framing import recorded_audio
from utils.training.setup import model_datasets

VOCODER = "waveglow" if "waveglow" in MODELS else "hifigan"
"""The project's vocoder (this file exists in projects with Tacotron2 and one of them)."""

SEGMENT = 4096
"""Crop of the dataset tests, in samples: 16 frames of 256."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "gta_corpus", 10)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return Path(made_once(tmp_path_factory, "gta_checkpoint",
                          lambda folder: str(tiny_checkpoint("tacotron2", folder / "tacotron2.pt")))[1])


@pytest.fixture
def one_process(monkeypatch):
    """This process as a plain single one, whatever launcher runs the tests."""
    for key in list(os.environ):
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)


def dump(capsys, *args) -> tuple[int, str, str]:
    """``python -m scripts.dump_gta_mels ARGS`` in this process: ``(exit status, stdout, stderr)``."""
    code = dump_gta_mels.main(["--device", "cpu", "--no-progress", *map(str, args)])
    said = capsys.readouterr()
    return code, said.out, said.err


def audio_cfg(framing: str = "nvidia"):
    """The tiny config's audio section; NVIDIA's framing: Tacotron2's recipe, what its checkpoints record."""
    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True,
                       overrides=[f"audio.mel_framing={framing}"]).audio


def utterances(corpus) -> Corpus:
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True,
                      overrides=[f"data.dataset_path={corpus}"])
    return Corpus.join(load_splits(cfg.data))


def real_mels(corpus, folder, framing: str = "nvidia") -> Path:
    """``folder/<id>.pt``: the mel of every clip of ``corpus`` computed from its audio (the frame rule's count)."""
    folder.mkdir(parents=True, exist_ok=True)
    mel_fn = MelSpectrogram(audio_cfg(framing))
    for utt in utterances(corpus):
        torch.save(mel_fn(load_wav(utt.audio, 22050)), folder / f"{utt.id}.pt")
    return folder


def assert_frame_rule(mels, corpus) -> int:
    """Every ``<id>.pt`` of ``mels`` is a float32 ``(n_mels, MelSpectrogram.num_frames(samples))``; returns how many."""
    mel_fn = MelSpectrogram(audio_cfg())
    files = sorted(Path(mels).glob("*.pt"))
    for path in files:
        mel = torch.load(path, weights_only=True)
        samples = load_wav(Path(corpus) / "wavs" / f"{path.stem}.wav", 22050).shape[0]
        assert mel.dtype == torch.float32 and mel.shape == (audio_cfg().n_mels, mel_fn.num_frames(samples)), (path.stem, mel.shape)
        assert mel.shape[1] == samples // 256 + 1  # NVIDIA's centred frames, Tacotron2's recipe
        assert torch.isfinite(mel).all() and mel.untyped_storage().nbytes() == mel.numel() * 4  # no padding kept
    return len(files)


# --- the dump in this process ---------------------------------------------------------------------------------------

def test_a_mel_off_the_frame_rule_is_one_error_line_and_a_resumed_dump_writes_only_the_rest(corpus, checkpoint,
                                                                                          tmp_path, capsys,
                                                                                          one_process):
    data = tmp_path / "corpus"
    shutil.copytree(corpus, data)
    (data / "mels").mkdir()  # tacotron2.mel_cache_dir: the targets; one of them a frame too long
    mel = MelSpectrogram(audio_cfg())(load_wav(data / "wavs" / "SYN-0004.wav", 22050))
    torch.save(torch.cat([mel, mel[:, -1:]], dim=1), data / "mels" / "SYN-0004.pt")
    out = tmp_path / "gta"
    code, said, errors = dump(capsys, "--checkpoint", checkpoint, "--dataset-path", data, "--output", out)
    assert code == 1
    assert [line for line in errors.splitlines() if line.startswith("ERROR")] == [errors.strip()], errors
    assert errors.startswith("ERROR: SYN-0004: ") and "frame rule" in errors, errors
    assert "10 utterances: 9 mels written, 0 already there, 0 left out, 1 failed" in said, said
    assert not (out / "SYN-0004.pt").exists() and assert_frame_rule(out, data) == 9
    assert json.loads((out / "_audio_config.json").read_text())["hop_length"] == 256

    (data / "mels" / "SYN-0004.pt").unlink()  # fixed: the target comes from the wav
    code, said, errors = dump(capsys, "--checkpoint", checkpoint, "--dataset-path", data, "--output", out)
    assert code == 0 and errors == "", errors
    assert "10 utterances: 1 mels written, 9 already there, 0 left out, 0 failed" in said, said
    assert assert_frame_rule(out, data) == 10

    source = json.loads((out / "_gta_source.json").read_text())  # mels of other weights: never mixed
    (out / "_gta_source.json").write_text(json.dumps({**source, "weights_sha256": "0" * 64}))
    code, said, errors = dump(capsys, "--checkpoint", checkpoint, "--dataset-path", data, "--output", out)
    assert code == 1 and errors.count("\n") == 1 and "other Tacotron2 weights" in errors, errors


def test_too_long_utterances_are_left_out_in_one_line_and_bad_options_are_one_line(corpus, checkpoint, tmp_path, capsys,
                                                                                  one_process):
    lengths = {utt.id: load_wav(utt.audio, 22050).shape[0] // 256 + 1 for utt in utterances(corpus)}
    limit = sorted(lengths.values())[6]
    longer = sorted(utt_id for utt_id, frames in lengths.items() if frames > limit)
    code, said, errors = dump(capsys, "--checkpoint", checkpoint, "--dataset-path", corpus, "--output",
                              tmp_path / "gta", "--max-mel-frames", limit, "--batch-size", 4)
    assert code == 0 and errors == "", errors
    notes = [line for line in said.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and f"left out {len(longer)} utterance(s) longer than tacotron2.max_mel_frames={limit}" in \
        notes[0] and ", ".join(longer) in notes[0], said
    assert sorted(path.stem for path in (tmp_path / "gta").glob("*.pt")) == sorted(set(lengths) - set(longer))
    assert json.loads((tmp_path / "gta" / "_left_out.json").read_text()) == {
        "max_mel_frames": limit, "frames": {utt_id: lengths[utt_id] for utt_id in longer}}
    assert json.loads((tmp_path / "gta" / "_audio_config.json").read_text())["mel_framing"] == "nvidia"

    # the vocoder on that folder frames as its mels (NVIDIA's, whatever its recipe) and trains without those left out,
    # saying so in one line; a framing set against the folder's is refused in one line
    argv = ["--config", "config.json", "--model", VOCODER, "--tiny", "--dataset-path", str(corpus),
            "--set", f"data.mel_dir={tmp_path / 'gta'}", "--set", "data.val_size=1"]
    cfg = train.load_run_config(train.parse_args(argv))
    assert cfg.audio.mel_framing == "nvidia" and cfg.train.grad_clip == MODELS[VOCODER].recipe["train.grad_clip"]
    with pytest.warns(UserWarning) as said:
        train_set, val_set = model_datasets(MODELS[VOCODER], cfg, PARTS.run.datasets)
    kept = sorted(utt.id for utt in [*train_set.corpus, *val_set.corpus])
    assert kept == sorted(set(lengths) - set(longer)), kept
    lines = [str(warning.message) for warning in said]
    expected = f"than the text-to-mel model's max_mel_frames={limit} mel frames"
    assert all("\n" not in line and expected in line for line in lines)
    assert sum(int(line.split("without ")[1].split(" of ")[0]) for line in lines) == len(longer), lines
    assert val_set[0]["mel"].shape[1] == getattr(cfg, VOCODER).segment_length // 256
    cfg = train.load_run_config(train.parse_args([*argv, "--set", "audio.mel_framing=jik876"]))
    with pytest.raises(DataError, match="other audio settings .*mel_framing: mels 'nvidia', config 'jik876'"):
        model_datasets(MODELS[VOCODER], cfg, PARTS.run.datasets)

    for args, message in ((["--batch-size", "0"], "--batch-size must be >= 1"),
                          (["--checkpoint", tmp_path / "none.pt"], "not found"),
                          (["--dataset-path", tmp_path / "nowhere"], "not a folder")):
        base = {"--checkpoint": checkpoint, "--dataset-path": corpus, "--output": tmp_path / "x"}
        base.update(dict(zip(args[::2], args[1::2])))
        code, said, errors = dump(capsys, *[str(v) for pair in base.items() for v in pair])
        assert code in (1, 2) and errors.count("\n") == 1 and message in errors, (args, errors)
    wrong = tmp_path / f"{VOCODER}.pt"
    code, _, errors = dump(capsys, "--checkpoint", tiny_checkpoint(VOCODER, wrong), "--dataset-path", corpus,
                           "--output", tmp_path / "x")
    assert code == 1 and errors.count("\n") == 1 and "give a Tacotron2 checkpoint" in errors, errors


def test_a_dump_from_an_early_import_that_recorded_no_framing_makes_nvidias_frames(corpus, checkpoint, tmp_path,
                                                                                   capsys, one_process):
    """A file of an earlier ``scripts.import_weights`` (NVIDIA's Tacotron2 weights; ``audio.mel_framing`` null, step 0):
    its GTA mels have Tacotron2's reference frames, NVIDIA's, recorded for the vocoder, and one note says so."""
    early = reframed_checkpoint(checkpoint, tmp_path / "imported.pt", None, {"source": "tacotron2_statedict.pt"})
    code, said, errors = dump(capsys, "--checkpoint", early, "--dataset-path", corpus, "--output", tmp_path / "gta")
    assert code == 0 and errors.splitlines() == [
        f"note: {early} records no audio.mel_framing (an import of an earlier version): its mels are framed as "
        "tacotron2's reference frames them, nvidia (ModelSpec.recipe)"], errors
    assert json.loads((tmp_path / "gta" / "_audio_config.json").read_text())["mel_framing"] == "nvidia"
    assert assert_frame_rule(tmp_path / "gta", corpus) == 10


# --- data.mel_dir in the dataset ------------------------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["nvidia", "jik876"])
def test_audio_and_mel_are_cropped_together_on_frame_boundaries_with_the_seeded_crops(corpus, tmp_path, framing):
    mels = real_mels(corpus, tmp_path / "mels", framing)
    utts, cfg = utterances(corpus), audio_cfg(framing)
    mel_fn = MelSpectrogram(cfg)
    data = MelDirDataset(utts, cfg, Crop(SEGMENT, seed=7), mels)
    starts = []
    for index, utt in enumerate(utts):
        item, whole = data[index], torch.load(mels / f"{utt.id}.pt", weights_only=True)
        audio = load_wav(utt.audio, 22050)
        assert item["mel"].shape == (cfg.n_mels, SEGMENT // 256) and item["audio"].shape == (SEGMENT,)
        start = next(f for f in range(whole.shape[1] - 15) if torch.equal(whole[:, f:f + 16], item["mel"]))
        assert torch.equal(item["audio"], audio[start * 256:start * 256 + SEGMENT])  # the same frames' samples
        # frames whose STFT window lies inside the crop are the crop's own mel: aligned to the sample
        assert torch.allclose(mel_fn(item["audio"])[:, 2:13], item["mel"][:, 2:13], atol=1e-4)
        assert torch.equal(data[index]["mel"], item["mel"])  # seeded by (seed, epoch, index)
        starts.append(start)
    data.set_epoch(1)
    assert [next(f for f in range(400) if torch.equal(torch.load(mels / f"{u.id}.pt", weights_only=True)[:, f:f + 16],
                                                      data[i]["mel"])) for i, u in enumerate(utts)] != starts
    first = MelDirDataset(utts, cfg, Crop(SEGMENT, random=False), mels)[0]
    assert torch.equal(first["mel"], torch.load(mels / f"{utts[0].id}.pt", weights_only=True)[:, :16])

    short = tmp_path / "short"  # 3000 samples: 11 frames (NVIDIA's: 12), then silence in both
    (short / "wavs").mkdir(parents=True)
    sf.write(short / "wavs" / "S.wav", load_wav(utts[0].audio, 22050)[:3000].numpy(), 22050, subtype="PCM_16")
    audio = load_wav(short / "wavs" / "S.wav", 22050)
    torch.save(mel_fn(audio), short / "S.pt")
    item = MelDirDataset(Corpus.of([Utterance("S", str(short / "wavs" / "S.wav"), "a")]), cfg, Crop(SEGMENT), short)[0]
    n = {"nvidia": 12, "jik876": 11}[framing]
    assert torch.equal(item["mel"][:, :n], mel_fn(audio)) and (item["mel"][:, n:] == SILENCE_LOG_MEL).all()
    kept = min(n * 256, 3000)  # the audio of its frames (NVIDIA's 12 reach past its end)
    assert torch.equal(item["audio"][:kept], audio[:kept]) and not item["audio"][kept:].any()


def test_a_missing_mel_or_a_wrong_frame_count_is_one_line_naming_the_utterance_and_file(corpus, tmp_path):
    mels = real_mels(corpus, tmp_path / "mels")
    utts, cfg = utterances(corpus), audio_cfg()
    (mels / "SYN-0003.pt").unlink()
    with pytest.raises(DataError) as err:
        MelDirDataset(utts, cfg, Crop(SEGMENT), mels)
    assert "\n" not in str(err.value) and "'SYN-0003'" in str(err.value) and str(mels / "SYN-0003.pt") in str(err.value)

    mel = torch.load(mels / "SYN-0002.pt", weights_only=True)
    torch.save(mel[:, :-1], mels / "SYN-0003.pt")  # another clip's length here
    data = MelDirDataset(utts, cfg, Crop(SEGMENT), mels)
    with pytest.raises(DataError) as err:
        data[[utt.id for utt in utts].index("SYN-0003")]
    message = str(err.value)
    assert "\n" not in message and "'SYN-0003'" in message and str(mels / "SYN-0003.pt") in message, message
    assert "frames; its audio" in message, message

    (mels / "_audio_config.json").write_text(json.dumps({**cfg.model_dump(), "hop_length": 200}))
    with pytest.raises(DataError, match="other audio settings .*hop_length: mels 200, config 256"):
        MelDirDataset(utts, cfg, Crop(SEGMENT), mels)
    (mels / "_audio_config.json").unlink()
    with pytest.raises(ValueError, match="not a multiple of audio.hop_length=256.*use 3840 or 4096"):
        MelDirDataset(utts, cfg, Crop(4000), mels)


def test_the_vocoder_reads_data_mel_dir_and_mel_on_device_with_it_is_refused_before_any_data(corpus, tmp_path):
    mels = real_mels(corpus, tmp_path / "mels", MODELS[VOCODER].recipe["audio.mel_framing"])  # no record: the recipe's
    cfg = train.load_run_config(train.parse_args(["--model", VOCODER, "--tiny", "--dataset-path", str(corpus),
                                                  "--set", f"data.mel_dir={mels}"]))
    train_set, val_set = model_datasets(MODELS[VOCODER], cfg, PARTS.run.datasets)
    item = val_set[0]  # the first crop: the file's first frames
    assert train_set.mel_dir == val_set.mel_dir == mels
    frames = getattr(cfg, VOCODER).segment_length // 256
    assert torch.equal(item["mel"], torch.load(mels / f"{item['id']}.pt", weights_only=True)[:, :frames])

    argv = ["--config", "config.json", "--model", VOCODER, "--tiny", "--dataset-path", str(tmp_path / "nowhere"),
            "--set", f"data.mel_dir={mels}"]
    refused = train.check_command_line([*argv, "--set", f"{VOCODER}.mel_on_device=true"])
    assert refused is not None and "\n" not in refused and f"{VOCODER}.mel_on_device=true" in refused and \
        "data.mel_dir" in refused, refused  # before the corpus (not there) is looked at
    refused = train.check_command_line([*argv, "--set", f"{VOCODER}.segment_length=4000"])
    assert refused is not None and "not a multiple of audio.hop_length=256" in refused, refused
    refused = train.check_command_line([*argv[:3], "tacotron2", *argv[4:]])  # a text model reads no mels
    assert refused is not None and "is not a vocoder" in refused and "leave data.mel_dir empty" in refused, refused


# --- two ranks, then a vocoder trained on their mels ----------------------------------------------------------------

@pytest.fixture(scope="module")
def dumped(corpus, checkpoint, tmp_path_factory):
    """``multiproc.py --nproc-per-node 2 -m scripts.dump_gta_mels`` (once per session): ``(exit status, output, mel
    folder, logs)``."""
    def run(out):
        cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir", str(out / "logs"),
               "-m", "scripts.dump_gta_mels", "--checkpoint", str(checkpoint), "--dataset-path", str(corpus),
               "--output", str(out / "mels"), "--device", "cpu", "--batch-size", "2"]
        return finish(start_job(cmd, out, nproc=2), timeout=bound(120))
    out, (code, output) = made_once(tmp_path_factory, "gta_dump", run)
    return code, output, out / "mels", out / "logs"


@pytest.mark.slow
def test_two_ranks_write_every_utterance_once_by_the_frame_rule(dumped, corpus):
    code, output, mels, logs = dumped
    assert code == 0, output[-4000:]
    ids = sorted(utt.id for utt in utterances(corpus))
    assert sorted(path.stem for path in mels.glob("*.pt")) == ids and assert_frame_rule(mels, corpus) == 10
    assert "rank 0 of 2: 5 of 10 utterances" in output
    assert "rank 1 of 2: 5 of 10 utterances" in (logs / "rank_1.stdout.log").read_text()
    assert ("10 utterances: 10 mels written, 0 already there, 0 left out, 0 failed -> "
            f"{mels} (rank 0: 5 written + 0 already there of 5, rank 1: 5 written + 0 already there of 5)") in output
    assert json.loads((mels / "_audio_config.json").read_text())["n_mels"] == audio_cfg().n_mels


@pytest.mark.slow
def test_the_vocoder_trains_on_the_dumped_mels_and_its_loss_falls(dumped, corpus, tmp_path):
    code, output, mels, _ = dumped
    assert code == 0, output[-4000:]
    out = tmp_path / "vocoder"
    train_in_process(["--config", "config.json", "--model", VOCODER, "--tiny", "--max-steps", "8", "--dataset-path",
                      str(corpus), "--output-dir", str(out), "--set", f"data.mel_dir={mels}", "--set",
                      "data.num_workers=0", "--set", "train.log_interval=1", "--set", "train.val_interval=100",
                      "--set", "train.checkpoint_interval=100"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 9))
    losses = [row["losses"]["mel_l1"] if VOCODER == "hifigan" else row["loss"] for row in rows]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.05 * max(1.0, abs(first)), losses  # WaveGlow: NLL per sample; HiFi-GAN: mel L1


@pytest.mark.slow
def test_two_ranks_fine_tune_on_clips_one_segment_long_whose_every_crop_reaches_the_clips_end(tmp_path):
    """Clips of one segment or a little less in NVIDIA's framing (a Tacotron2 dump's, which the vocoder follows):
    ``1 + T // 256`` mel frames, whose audio reaches past the clip's ``T`` samples. 8 of the 10 clips have just the
    crop's frames (their one crop, validation's too, ends on the last), 2 one more; each crop is a whole segment (zeros
    past the end) and the batches collate (they failed to: a crop at the end was short). The 2 ranks run ``train.py``'s
    ``main``, started by hand (what is proven is the data, not the launcher)."""
    segment = getattr(load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True), VOCODER).segment_length
    corpus = synth_corpus(tmp_path / "corpus", n=10, seconds=(segment + 1) / 22050, spread=(1.0, 1.0))
    for shorter, wav in zip((0, 1, 37, 100, 128, 129, 200, 255, 0, 256), sorted((corpus / "wavs").glob("*.wav"))):
        audio, rate = sf.read(wav, dtype="float32")  # segment - shorter samples: one or no frame more than the crop's
        sf.write(wav, audio[:segment - shorter], rate, subtype="PCM_16")
        assert sf.info(wav).frames == segment - shorter
    mels = real_mels(corpus, tmp_path / "mels")
    (mels / MEL_SETTINGS_FILE).write_text(json.dumps(recorded_audio(audio_cfg().model_dump())))  # as a dump records
    argv = ["--config", os.path.join(ROOT, "config.json"), "--model", VOCODER, "--tiny", "--max-steps", "2",
            "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"), "--set", f"data.mel_dir={mels}",
            "--set", "data.num_workers=0", "--set", "train.val_interval=2"]
    outputs = train_on_ranks(argv, tmp_path / "ranks", timeout=bound(180))  # each rank must exit 0
    assert "done: 2 steps" in outputs[0] and not any("Traceback" in output for output in outputs), outputs[0][-3000:]
