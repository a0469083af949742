"""Tacotron2: model size and shapes, loss and masking, inference stopping, data pipeline, preprocessing."""

import contextlib
import copy
import io
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import (ROOT, VOICE_LAYOUTS, assert_four_voices, assert_speaks_each_voice, check_recipe, demo_corpus, four_voice_argv,
                      frame_budgets_resume_through_2_1_2, read_ljspeech, run_train_main, synth_corpus, tiny_checkpoint,
                      train_in_process, train_on_ranks)
from test_checkpoint_safety import LARGER, crafted_outcomes, larger_refused
from torch._dynamo.utils import counters

import inference
from models import MODELS
from models.tacotron2.data import TextMelCollate, TextMelDataset, build_datasets, count_items
from models.tacotron2.inference import dynamic_range_decompression, griffin_lim, log_validation
from models.tacotron2.network import Tacotron2, Tacotron2Config, Tacotron2Loss
from modules.layers import ConvNorm
from scripts import preprocess
from utils.config import build_config
from utils.data.audio import AudioConfig, MelSpectrogram, dynamic_range_compression
from utils.data.corpus import Corpus, DataError, Utterance
from models.tacotron2.plots import plot_alignment
from parts import PARTS, SHARED_SECTIONS

N_MELS = 12
TINY = dict(symbols_embedding_dim=32, encoder_embedding_dim=32, encoder_n_convolutions=2, encoder_kernel_size=5,
            attention_rnn_dim=48, attention_dim=16, attention_location_n_filters=4,
            attention_location_kernel_size=7, decoder_rnn_dim=48, prenet_dim=16, postnet_embedding_dim=16,
            postnet_n_convolutions=3, max_decoder_steps=50)
AUDIO = AudioConfig(sampling_rate=8000, n_fft=256, hop_length=64, win_length=256, n_mels=N_MELS, fmin=0.0,
                    fmax=4000.0)


def tiny_model(**overrides) -> Tacotron2:
    torch.manual_seed(0)
    return Tacotron2(Tacotron2Config(**{**TINY, **overrides}), N_MELS)


def make_item(utt_id: str, text_len: int, frames: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    # A smooth, learnable target: low-frequency curves per channel.
    t = torch.linspace(0, 1, frames)
    phase = torch.rand(N_MELS, 1, generator=g) * 6
    return {"text": torch.randint(1, 148, (text_len,), generator=g),
            "mel": torch.sin(3 * t + phase) - 2.0, "id": utt_id}


def tiny_batch() -> dict:
    return TextMelCollate()([make_item("short", 6, 14, 1), make_item("long", 9, 20, 2)])


def write_corpus(root: Path, durations: dict, sampling_rate: int = 8000) -> Path:
    """LJSpeech layout: metadata.csv (id|raw|normalized) and wavs/<id>.wav of sine + noise."""
    (root / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = []
    for i, (utt_id, seconds) in enumerate(durations.items()):
        t = np.arange(int(seconds * sampling_rate)) / sampling_rate
        audio = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.01 * rng.standard_normal(t.size)
        sf.write(root / "wavs" / f"{utt_id}.wav", audio.astype(np.float32), sampling_rate, subtype="PCM_16")
        lines.append(f"{utt_id}|Utterance number {i + 1}.|Utterance number {i + 1}.")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def test_default_parameter_count_matches_nvidia():
    net = Tacotron2(Tacotron2Config(), 80)
    count = sum(p.numel() for p in net.parameters())
    lstm = lambda i, h: 4 * h * (i + h) + 8 * h  # noqa: E731  (weights + two biases)
    conv = lambda i, o, k, bias=True: i * o * k + (o if bias else 0)  # noqa: E731
    expected = (148 * 512                                                          # embedding
                + 3 * (conv(512, 512, 5) + 2 * 512) + 2 * lstm(512, 256)             # encoder
                + 80 * 256 + 256 * 256                                               # prenet, no bias
                + lstm(256 + 512, 1024) + lstm(1024 + 512, 1024)                     # two LSTM cells
                + 1024 * 128 + 512 * 128 + 128 + conv(2, 32, 31, False) + 32 * 128   # attention
                + (1536 * 80 + 80) + (1536 + 1)                                      # mel and gate
                + conv(80, 512, 5) + 1024 + 3 * (conv(512, 512, 5) + 1024)           # postnet
                + conv(512, 80, 5) + 160)
    assert count == expected == 28_193_153
    assert abs(count - 28_193_458) / 28_193_458 < 0.005  # NVIDIA's quoted figure, 28.2 M


def test_forward_shapes_and_padding_mask():
    net = tiny_model()
    batch = tiny_batch()
    out = net(batch)
    assert out["mel"].shape == out["mel_postnet"].shape == (2, N_MELS, 20)
    assert out["gate"].shape == (2, 20)
    assert out["alignments"].shape == (2, 20, 9)
    # Sorted longest text first: item 1 is "short" with 14 frames and 6 symbols.
    assert batch["ids"] == ["long", "short"]
    assert torch.all(out["mel"][1, :, 14:] == 0) and torch.all(out["mel_postnet"][1, :, 14:] == 0)
    assert torch.all(out["gate"][1, 14:] == 1e3)
    assert torch.allclose(out["alignments"].sum(-1), torch.ones(2, 20), atol=1e-5)
    assert torch.all(out["alignments"][1, :, 6:] < 1e-6)  # no attention on padded text


def test_every_parameter_gets_a_gradient():
    net = tiny_model()
    batch = tiny_batch()
    Tacotron2Loss()(net(batch), batch)[0].backward()
    missing = [name for name, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []  # DDP needs every parameter in every step


@pytest.mark.slow
def test_loss_is_finite_and_decreases_when_overfitting():
    net = tiny_model()
    batch = tiny_batch()
    criterion = Tacotron2Loss()
    optimizer = torch.optim.Adam(net.parameters(), lr=5e-3)
    losses = []
    for _ in range(20):
        loss, terms = criterion(net(batch), batch)
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert list(terms) == ["mel", "mel_postnet", "gate"] and not any(term.requires_grad for term in terms.values())
    assert loss.item() == pytest.approx(sum(term.item() for term in terms.values()), rel=1e-6)
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses


def test_padding_frames_and_symbols_do_not_change_loss():
    net = tiny_model().eval()
    net.decoder.prenet.dropout = 0.0  # the pre-net is stochastic even in eval mode
    criterion = Tacotron2Loss()
    batch = tiny_batch()
    padded = tiny_batch()
    padded["mel"] = torch.nn.functional.pad(padded["mel"], (0, 12))  # 20 -> 32 frames
    padded["gate"] = torch.nn.functional.pad(padded["gate"], (0, 12), value=1.0)  # 1 from the last real frame on
    padded["text"] = torch.cat([padded["text"], torch.zeros(2, 4, dtype=torch.long)], dim=1)  # 4 extra pads
    assert padded["mel"].shape[2] == 32
    with torch.no_grad():
        out, out_padded = net(batch), net(padded)
        loss, loss_padded = criterion(out, batch)[0], criterion(out_padded, padded)[0]
    assert torch.allclose(loss, loss_padded, atol=1e-5)
    assert torch.allclose(out["mel_postnet"], out_padded["mel_postnet"][:, :, :20], atol=1e-5)


def test_loss_ignores_whatever_is_in_padded_frames():
    batch = tiny_batch()
    out = tiny_model()(batch)
    garbage = {k: v.detach().clone() for k, v in out.items()}
    garbage["mel"][1, :, 14:] = 123.0
    garbage["mel_postnet"][1, :, 14:] = -50.0
    garbage["gate"][1, 14:] = -30.0
    criterion = Tacotron2Loss()
    assert torch.allclose(criterion(out, batch)[0], criterion(garbage, batch)[0])
    garbage["mel"][1, :, 13] += 1.0  # the last real frame does count
    assert criterion(garbage, batch)[0] > criterion(out, batch)[0]


def test_bf16_autocast_forward_backward():
    net = tiny_model()
    batch = tiny_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = Tacotron2Loss()(net(batch), batch)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())


def test_inference_stops_when_the_gate_fires():
    net = tiny_model().eval()
    with torch.no_grad():
        net.decoder.gate_layer.bias.fill_(20.0)  # stop probability ~1 from the first frame
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mel, gate, alignments = net.inference(torch.randint(1, 148, (1, 7)))
    assert mel.shape == (1, N_MELS, 1) and gate.shape == (1, 1) and alignments.shape == (1, 1, 7)


def test_inference_warns_and_stops_at_max_decoder_steps():
    net = tiny_model(max_decoder_steps=5).eval()
    with torch.no_grad():
        net.decoder.gate_layer.bias.fill_(-20.0)  # never stops by itself
    with pytest.warns(UserWarning, match="max_decoder_steps=5"):
        mel, gate, alignments = net.inference(torch.randint(1, 148, (1, 7)))
    assert mel.shape == (1, N_MELS, 5) and gate.shape == (1, 5) and alignments.shape == (1, 5, 7)
    assert torch.isfinite(mel).all()


def test_inference_rejects_bad_input():
    net = tiny_model().eval()
    with pytest.raises(ValueError, match="symbol ids of shape"):
        net.inference(torch.randint(1, 148, (7,)))
    with pytest.raises(ValueError, match="symbol ids of shape"):
        net.inference(torch.rand(1, 7))


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="n_symbols"):
        Tacotron2(Tacotron2Config(**{**TINY, "n_symbols": 10}), N_MELS)
    with pytest.raises(ValueError, match="odd kernel_size"):
        ConvNorm(4, 4, kernel_size=4)


def test_config_section_loads_and_is_checked():
    schemas = {**SHARED_SECTIONS, "tacotron2": Tacotron2Config}
    cfg = build_config({"tacotron2": {"batch_size": 4, "text_cleaners": ["basic_cleaners"]}}, schemas)
    assert cfg.tacotron2.batch_size == 4 and cfg.tacotron2.text_cleaners == ["basic_cleaners"]
    assert cfg.tacotron2.n_symbols == 148 and cfg.tacotron2.encoder_embedding_dim == 512
    with pytest.raises(ValueError, match="text_cleaners"):
        build_config({"tacotron2": {"text_cleaners": "english_cleaners"}}, schemas)
    spec = MODELS["tacotron2"]
    assert spec.config_cls is Tacotron2Config
    assert "batch_size" in Tacotron2Config.model_fields  # its rate and weight decay: the optimizer section's


def test_collate_sorts_pads_and_builds_gate_targets():
    items = [make_item("a", 3, 5, 0), make_item("b", 7, 4, 1), make_item("c", 5, 8, 2)]
    batch = TextMelCollate()(items)
    assert batch["ids"] == ["b", "c", "a"]
    assert batch["text_lengths"].tolist() == [7, 5, 3] and batch["mel_lengths"].tolist() == [4, 8, 5]
    assert batch["text"].shape == (3, 7) and batch["text"].dtype == torch.long
    assert torch.equal(batch["text"][2, :3], items[0]["text"]) and torch.all(batch["text"][2, 3:] == 0)
    assert batch["mel"].shape == (3, N_MELS, 8)
    assert torch.equal(batch["mel"][0, :, :4], items[1]["mel"]) and torch.all(batch["mel"][0, :, 4:] == 0)
    assert batch["gate"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1]]
    assert count_items(batch) == 17
    with pytest.raises(ValueError, match="empty list"):
        TextMelCollate()([])


def test_dataset_computes_mels_skips_overlong_clips_and_counts_them(tmp_path):
    root = write_corpus(tmp_path / "corpus", {"u1": 0.3, "u2": 0.5, "long1": 2.0, "long2": 1.5})
    utts = Corpus.of(read_ljspeech(root))
    with pytest.warns(UserWarning, match="skipped 2 of 4 utterances.*max_mel_frames=80"):
        ds = TextMelDataset(utts, AUDIO, root / "mels", max_mel_frames=80)
    assert sorted(ds.skipped_ids) == ["long1", "long2"] and len(ds) == 2
    item = ds[1]
    assert item["id"] == "u2" and item["text"].dtype == torch.long and item["text"].dim() == 1
    expected = MelSpectrogram(AUDIO)(torch.from_numpy(sf.read(root / "wavs/u2.wav", dtype="float32")[0]))
    assert item["mel"].shape == expected.shape == (N_MELS, ds.mel_transform.num_frames(4000))
    assert torch.allclose(item["mel"], expected, atol=1e-4)
    # The header-based estimate (used for skipping) equals the real frame count.
    assert ds.lengths()[1] == item["mel"].shape[1]


def test_dataset_reads_cached_mels_and_checks_them(tmp_path):
    root = write_corpus(tmp_path / "corpus", {"u1": 0.3, "u2": 0.3})
    utts = Corpus.of([Utterance("u1", str(root / "wavs/u1.wav"), "Hello."),
                      Utterance("u2", str(root / "wavs/u2.wav"), "World.")])
    (root / "mels").mkdir()
    sentinel = torch.full((N_MELS, 7), 0.25)
    torch.save(sentinel, root / "mels/u1.pt")
    torch.save(torch.zeros(3, 7), root / "mels/u2.pt")
    ds = TextMelDataset(utts, AUDIO, root / "mels")
    assert torch.equal(ds[0]["mel"], sentinel)
    with pytest.raises(DataError, match="cached mel of 'u2'"):
        ds[1]
    ds_no_cache = TextMelDataset(utts, AUDIO, None)
    assert ds_no_cache[0]["mel"].shape == (N_MELS, ds_no_cache.mel_transform.num_frames(2400))


def test_dataset_rejects_empty_transcripts_and_stale_caches(tmp_path):
    root = write_corpus(tmp_path / "corpus", {"u1": 0.3})
    with pytest.raises(DataError, match="'u1' has an empty transcript"):
        TextMelDataset(Corpus.of([Utterance("u1", str(root / "wavs/u1.wav"), "  ")]), AUDIO)
    (root / "mels").mkdir()
    stale = {**AUDIO.model_dump(), "hop_length": 32}
    (root / "mels/_audio_config.json").write_text(json.dumps(stale))
    with pytest.raises(DataError, match="hop_length"):
        TextMelDataset(Corpus.of([Utterance("u1", str(root / "wavs/u1.wav"), "Hi.")]), AUDIO, root / "mels")


def write_config(tmp_path: Path, root: Path) -> Path:
    config = {"audio": AUDIO.model_dump(), "data": {"dataset_path": str(root), "val_size": 1},
              "tacotron2": {**TINY, "max_mel_frames": 200, "batch_size": 2}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_preprocess_writes_mels_then_skips_them(tmp_path, capsys):
    root = write_corpus(tmp_path / "corpus", {f"u{i}": 0.2 + 0.05 * i for i in range(4)})
    config = write_config(tmp_path, root)
    assert preprocess.main(["--config", str(config), "--workers", "2", "--no-progress"]) == 0
    assert "4 mels written, 0 already cached" in capsys.readouterr().out
    files = sorted((root / "mels").glob("*.pt"))
    assert [f.stem for f in files] == ["u0", "u1", "u2", "u3"]
    assert not list((root / "mels").glob(".*.tmp"))
    mel = torch.load(files[1], map_location="cpu", weights_only=True)
    wav = torch.from_numpy(sf.read(root / "wavs/u1.wav", dtype="float32")[0])
    nvidia = AudioConfig(**{**AUDIO.model_dump(), "mel_framing": "nvidia"})  # the config's null: Tacotron2's recipe
    assert torch.allclose(mel, MelSpectrogram(nvidia)(wav), atol=1e-4)
    assert json.loads((root / "mels/_audio_config.json").read_text()) == nvidia.model_dump()
    stamps = [f.stat().st_mtime_ns for f in files]
    assert preprocess.main(["--config", str(config), "--workers", "1", "--no-progress"]) == 0
    assert "0 mels written, 4 already cached" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == stamps
    (root / "mels/u2.pt").unlink()
    assert preprocess.main(["--config", str(config), "--workers", "1", "--no-progress"]) == 0
    assert "1 mels written, 3 already cached" in capsys.readouterr().out
    # Other audio settings are refused without --overwrite.
    config_data = json.loads(config.read_text())
    config_data["audio"]["hop_length"] = 32
    config.write_text(json.dumps(config_data))
    assert preprocess.main(["--config", str(config), "--no-progress"]) == 1
    assert "hop_length" in capsys.readouterr().err
    assert preprocess.main(["--config", str(config), "--workers", "1", "--overwrite", "--no-progress"]) == 0
    assert "4 mels written" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["a file in its place", "a read-only dataset folder"])
def test_preprocess_names_a_cache_folder_it_cannot_write_in_one_line(tmp_path, capsys, how):
    root = write_corpus(tmp_path / "corpus", {"u0": 0.2, "u1": 0.25})
    config = write_config(tmp_path, root)
    if how == "a file in its place":
        (root / "mels").write_text("mine")
    elif os.geteuid() == 0:
        pytest.skip("root may write into a read-only folder")
    else:
        root.chmod(0o500)
    try:
        code = preprocess.main(["--config", str(config), "--workers", "1", "--no-progress"])
    finally:
        root.chmod(0o700)
    out, err = capsys.readouterr()
    assert code == 1 and err.startswith(f"ERROR: cannot write the mel cache folder {root / 'mels'}: "), err
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err, err


def test_spec_datasets_and_validation_pictures(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    root = write_corpus(tmp_path / "corpus", {f"u{i}": 0.2 + 0.05 * i for i in range(4)})
    schemas = {**SHARED_SECTIONS, "tacotron2": Tacotron2Config}
    cfg = build_config({"audio": AUDIO.model_dump(), "data": {"dataset_path": str(root), "val_size": 1},
                        "tacotron2": TINY}, schemas)
    spec = MODELS["tacotron2"]
    train_ds, val_ds = spec.training.build_datasets(cfg)
    assert (len(train_ds), len(val_ds)) == (3, 1)
    batch = spec.training.collate_fn([train_ds[0], train_ds[2]])
    net = spec.build_model(cfg).eval()
    with torch.no_grad():
        outputs = net(batch)
    loss, _ = spec.training.build_criterion(cfg)(outputs, batch)
    assert torch.isfinite(loss) and spec.training.count_items(batch) == int(batch["mel_lengths"].sum())
    log_validation(net, batch, outputs, 7, None, tmp_path / "out")
    assert (tmp_path / "out/alignment_7.png").stat().st_size > 0
    with SummaryWriter(tmp_path / "tb") as writer:
        spec.training.log_validation(net, batch, outputs, 8, writer, tmp_path / "out")
    assert (tmp_path / "out/alignment_8.png").is_file() and list((tmp_path / "tb").glob("events.*"))


def test_plot_alignment_checks_input(tmp_path):
    figure = plot_alignment(np.random.rand(5, 9), tmp_path / "a.png", title="t")
    assert (tmp_path / "a.png").stat().st_size > 0 and figure.axes[0].get_title() == "t"
    with pytest.raises(ValueError, match="alignment must be 2-D"):
        plot_alignment(np.zeros(4))


def test_registered_with_the_contract():
    spec = MODELS["tacotron2"]
    assert spec.training.build_datasets is build_datasets and spec.training.count_items is count_items
    assert spec.inference.infer is not None
    if "tacotron2" in PARTS.benchmarks:  # the benchmarks part
        assert PARTS.benchmarks["tacotron2"].synthetic_batch is not None and PARTS.benchmarks["tacotron2"].cases


def tiny_tacotron2(text_bucket=1):
    from modules.tacotron2 import Decoder
    torch.manual_seed(0)
    decoder = Decoder(12, Tacotron2Config(encoder_embedding_dim=16, attention_rnn_dim=24, decoder_rnn_dim=24,
                                          prenet_dim=8, attention_dim=8, attention_location_n_filters=4,
                                          attention_location_kernel_size=5, p_attention_dropout=0.0,
                                          p_decoder_dropout=0.0))
    decoder.prenet.dropout = 0.0
    decoder.text_bucket = text_bucket
    return decoder


def decoder_inputs(text_len, batch=3, frames=7, seed=0):
    from modules.tacotron2 import get_padding_mask
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([text_len] + [max(1, text_len - 2 - i) for i in range(batch - 1)])
    memory = torch.randn(batch, text_len, 16, generator=g)
    return memory, torch.randn(batch, 12, frames, generator=g), get_padding_mask(lengths, text_len)


def test_text_bucketing_leaves_the_decoder_outputs_unchanged():
    plain, bucketed = tiny_tacotron2(), tiny_tacotron2(text_bucket=8)
    memory, mels, mask = decoder_inputs(text_len=11)
    for a, b in zip(plain(memory, mels, mask), bucketed(memory, mels, mask)):
        assert a.shape == b.shape  # alignments are cut back to the 11 symbols
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_pad_memory_masks_only_the_added_positions():
    from modules.tacotron2 import pad_memory
    memory, _, mask = decoder_inputs(text_len=5)
    padded, padded_mask = pad_memory(memory, mask, 4)
    assert padded.shape == (3, 8, 16) and torch.equal(padded[:, :5], memory) and not padded[:, 5:].any()
    assert torch.equal(padded_mask[:, :5], mask) and padded_mask[:, 5:].all()
    same, same_mask = pad_memory(memory, None, 5)
    assert same is memory and not same_mask.any()
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        pad_memory(memory, mask, 0)


def test_decoder_step_is_one_static_graph_across_text_lengths_of_a_bucket(fresh_dynamo):
    decoder = tiny_tacotron2()
    decoder.enable_fast_path(text_bucket=8, backend="aot_eager")
    for text_len in (9, 13, 16):  # one bucket: 16 symbols
        memory, mels, mask = decoder_inputs(text_len, seed=text_len)
        mel, gate, alignments = decoder(memory, mels, mask)
        (mel.sum() + gate.sum()).backward()
        assert alignments.shape == (3, 7, text_len)
    assert counters["stats"]["unique_graphs"] == 1
    decoder(*decoder_inputs(17))  # the next bucket (24 symbols): a second graph
    assert counters["stats"]["unique_graphs"] == 2


def test_decoder_fast_path_refuses_a_bad_bucket(fresh_dynamo):
    decoder = tiny_tacotron2()
    with pytest.raises(ValueError, match="text_bucket must be >= 1"):
        decoder.enable_fast_path(text_bucket=0)
    decoder(*decoder_inputs(5))
    assert counters["stats"]["unique_graphs"] == 0


@pytest.mark.slow
def test_tacotron2_decoder_step_with_inductor(fresh_dynamo):
    """The real compiler on a tiny decoder step, dropout on (Inductor told to draw eager's numbers)."""
    import torch._inductor.config as inductor_config
    plain = tiny_tacotron2()
    plain.p_attention_dropout = plain.p_decoder_dropout = 0.1
    fast = copy.deepcopy(plain)
    fast.enable_fast_path(text_bucket=8)
    memory, mels, mask = decoder_inputs(text_len=6)
    results = []
    before = inductor_config.fallback_random
    with inductor_config.patch(fallback_random=True):  # for this test only: later tests compile without it
        for decoder in (plain, fast):
            torch.manual_seed(0)
            mel, gate, alignments = decoder(memory, mels, mask)
            (mel.square().sum() + gate.sum()).backward()
            results.append((mel, gate, alignments, torch.cat([p.grad.flatten() for p in decoder.parameters()])))
    assert inductor_config.fallback_random == before
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("tacotron2", tmp_path_factory.mktemp("tacotron2") / "tacotron2.pt")


@pytest.mark.parametrize("case, message", [
    ("folder", "--output {tmp} is a folder; give a file name ending in .wav"),
    ("mp3", "--output {tmp}/speech.mp3: has '.mp3'"),
    ("not-utf8", "--text-file {tmp}/latin1.txt is not UTF-8 text (invalid continuation byte at byte 3)"),
    ("empty-text", "--text is empty: give the sentence to speak"),
    ("nothing", "is a Tacotron2 checkpoint: give --text or --text-file"),
    ("output-is-a-file", "--output {tmp}/taken is a file; with --text-file it is the folder the wavs go to"),
])
def test_inference_mistakes_are_one_error_line(capsys, checkpoint, tmp_path, case, message):
    (tmp_path / "latin1.txt").write_bytes("Caf\u00e9 au lait.\n".encode("latin-1"))
    (tmp_path / "lines.txt").write_text("Hello there.\n")
    (tmp_path / "taken").write_text("")
    argv = {"folder": ["--text", "Hello.", "--output", str(tmp_path)],
            "mp3": ["--text", "Hello.", "--output", str(tmp_path / "speech.mp3")],
            "not-utf8": ["--text-file", str(tmp_path / "latin1.txt"), "--output", str(tmp_path / "wavs")],
            "empty-text": ["--text", "", "--output", str(tmp_path / "x.wav")],
            "nothing": ["--output", str(tmp_path / "x.wav")],
            "output-is-a-file": ["--text-file", str(tmp_path / "lines.txt"), "--output", str(tmp_path / "taken")]}
    code = inference.main(["--checkpoint", str(checkpoint), "--device", "cpu", *argv[case]])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert message.format(tmp=tmp_path) in errors[0], errors[0]
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "wavs").exists()


def test_griffin_lim_restores_the_pitch_of_a_sine():
    cfg = AudioConfig()
    t = torch.arange(cfg.sampling_rate) / cfg.sampling_rate
    mel = MelSpectrogram(cfg)(0.5 * torch.sin(2 * torch.pi * 1000.0 * t))
    audio = griffin_lim(mel, cfg, n_iter=16)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - mel.shape[1] * cfg.hop_length) <= cfg.hop_length
    peak_hz = np.argmax(np.abs(np.fft.rfft(audio))) * cfg.sampling_rate / len(audio)
    assert abs(peak_hz - 1000.0) < 30.0
    assert griffin_lim(mel.numpy(), cfg, n_iter=2).shape == audio.shape  # numpy input works as well


def test_griffin_lim_rejects_a_mel_of_the_wrong_shape():
    with pytest.raises(ValueError, match="n_mels=80"):
        griffin_lim(torch.zeros(40, 10), AudioConfig())
    with pytest.raises(ValueError, match="n_mels=80"):
        griffin_lim(torch.zeros(2, 80, 10), AudioConfig())


def test_dynamic_range_decompression_undoes_the_compression_above_its_floor():
    x = torch.tensor([1e-7, 1e-5, 0.01, 1.0, 123.0])
    torch.testing.assert_close(dynamic_range_decompression(dynamic_range_compression(x))[1:], x[1:])
    torch.testing.assert_close(dynamic_range_decompression(dynamic_range_compression(x, C=10.0), C=10.0)[1:], x[1:])


def test_griffin_lim_clip_lasts_as_long_as_the_mel():
    """``frames * hop_length`` samples in [-1, 1] (the shared ``griffin_lim`` gives one hop fewer; a mel shorter
    than one STFT window gives silence), and the audio of a sine's mel is not silent."""
    from models.tacotron2.inference import griffin_lim_clip

    t = torch.arange(AUDIO.sampling_rate // 2) / AUDIO.sampling_rate
    mel = MelSpectrogram(AUDIO)(0.5 * torch.sin(2 * torch.pi * 440 * t))  # (n_mels, 62)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # librosa warns of a signal shorter than n_fft: not asked to invert one
        for frames in (1, 4, 5, 7, mel.shape[1]):  # n_fft = 4 hops: from 5 frames on there is something to invert
            audio = griffin_lim_clip(mel[:, :frames], AUDIO, n_iter=4)
            assert audio.shape == (frames * AUDIO.hop_length,) and audio.dtype == torch.float32
            assert torch.isfinite(audio).all() and audio.abs().max() <= 1.0
            assert (audio.abs().max() == 0) == (frames <= 4), frames
    assert audio.pow(2).mean().sqrt() > 0.05


def test_validation_audio_draws_the_same_noise_and_leaves_the_training_random_stream_alone(tmp_path):
    """Also: ``val_audio_seconds`` 0 (``--tiny``'s) leaves the audio out and keeps the pictures."""
    from conftest import tensorboard_audio
    from torch.utils.tensorboard import SummaryWriter

    from models.tacotron2.inference import free_running_mel

    root = write_corpus(tmp_path / "corpus", {f"u{i}": 0.2 + 0.05 * i for i in range(4)})
    schemas = {**SHARED_SECTIONS, "tacotron2": Tacotron2Config}
    cfg = build_config({"audio": AUDIO.model_dump(), "data": {"dataset_path": str(root), "val_size": 1},
                        "tacotron2": TINY}, schemas)
    net = MODELS["tacotron2"].build_model(cfg).eval()
    batch = TextMelCollate()([build_datasets(cfg)[0][i] for i in (0, 1)])
    with torch.no_grad():
        outputs = net(batch)
    text = batch["text"][0, :int(batch["text_lengths"][0])]
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cutting the decoder at max_frames says nothing
        mels = [free_running_mel(net, text, max_frames=9) for _ in range(2)]
        with SummaryWriter(tmp_path / "tensorboard") as writer:
            log_validation(net, batch, outputs, 3, writer, tmp_path / "out", cfg=cfg)
    assert torch.equal(torch.get_rng_state(), state)  # the run's dropout and crops go on as without pictures
    assert torch.equal(mels[0], mels[1]) and mels[0].shape[0] == N_MELS and 1 <= mels[0].shape[1] <= 9
    assert net.decoder.max_decoder_steps == TINY["max_decoder_steps"]
    assert {"audio/teacher_forced_griffin_lim", "audio/free_running_griffin_lim"} <= set(tensorboard_audio(tmp_path))

    cfg.tacotron2.val_audio_seconds = 0.0  # --tiny's: pictures, no audio
    with SummaryWriter(tmp_path / "quiet" / "tensorboard") as writer:
        log_validation(net, batch, outputs, 3, writer, tmp_path / "quiet", cfg=cfg)
    assert tensorboard_audio(tmp_path / "quiet") == {} and (tmp_path / "quiet" / "alignment_3.png").is_file()


# --- one tiny run on LJSpeech-length clips, validating after each step: what it keeps, trains and logs ------------

def long_clip_corpus(root: Path, n: int = 6) -> Path:
    """``n`` clips of 6 to 9 s (conftest's 7.5 s +-20 %), the first one stretched to 10.2 s (LJSpeech's longest
    is 10.1 s), at 22050 Hz."""
    from conftest import synth_corpus

    corpus = synth_corpus(root, n=n, seconds=7.5)
    first = corpus / "wavs" / "SYN-0001.wav"
    audio, rate = sf.read(first, dtype="float32")
    sf.write(first, np.resize(audio, int(10.2 * rate)), rate, subtype="PCM_16")
    return corpus


VAL_AUDIO_SECONDS = 3.0
"""``tacotron2.val_audio_seconds`` of the shared run (``--tiny`` leaves the audio out): shorter than its validation
clip (6 s or more), so the teacher-forced and target audio are cut there, and longer than the free-running mel can
be (``max_decoder_steps`` 200 frames: 2.3 s)."""


@pytest.fixture(scope="module")
def long_clip_run(tmp_path_factory):
    """``(corpus, output folder, what it said)`` of ``train.py --model tacotron2 --tiny`` on :func:`long_clip_corpus`
    (in this process), 2 steps each logged and followed by a validation that logs audio (:data:`VAL_AUDIO_SECONDS`);
    made once per session and shared by the two tests below."""
    from conftest import made_once, train_with_validation_every_step

    def make(folder):
        return train_with_validation_every_step("tacotron2", long_clip_corpus(folder / "corpus"), folder / "out",
                                                "train.log_interval=1",
                                                f"tacotron2.val_audio_seconds={VAL_AUDIO_SECONDS}")
    folder, said = made_once(tmp_path_factory, "tacotron2_long_clips", make)
    return folder / "corpus", folder / "out", said


@pytest.mark.slow
def test_validation_writes_griffin_lim_audio_of_a_fixed_utterance_to_tensorboard(long_clip_run):
    """The shared run (``train.py``, 1 process, tiny, a validation after each of 2 steps): the teacher-forced and
    free-running mels of the first validation item as audio at both validations, its target mel at the first;
    ``audio.sampling_rate`` Hz, finite, and as long as the mels, cut at ``tacotron2.val_audio_seconds`` (which the
    run sets below the clip's length: ``--tiny`` leaves the audio out)."""
    from conftest import ROOT, tensorboard_audio

    from parts import config_schemas
    from utils.config import load_config

    corpus, out, _ = long_clip_run
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True,
                      overrides=[f"data.dataset_path={corpus}", "audio.mel_framing=nvidia"])  # train.py's: the recipe's
    rate, hop = cfg.audio.sampling_rate, cfg.audio.hop_length
    val_set = build_datasets(cfg)[1]
    first = TextMelCollate()([val_set[i] for i in range(len(val_set))])  # sorted by text length, as validate's
    max_frames = int(VAL_AUDIO_SECONDS * rate / hop)
    assert int(first["mel_lengths"][0]) > max_frames  # the run cuts its audio
    samples = min(int(first["mel_lengths"][0]), max_frames) * hop

    clips = tensorboard_audio(out)
    tags = {"audio/teacher_forced_griffin_lim": [1, 2], "audio/free_running_griffin_lim": [1, 2],
            "audio/target_griffin_lim": [1]}
    assert set(tags) <= set(clips), list(clips)
    for tag, steps in tags.items():
        assert [step for step, _, _ in clips[tag]] == steps, tag
        for step, clip_rate, clip in clips[tag]:
            assert clip_rate == rate and np.isfinite(clip).all()
            if tag == "audio/free_running_griffin_lim":  # as long as the model decodes before its gate fires
                assert clip.size % hop == 0 and hop <= clip.size <= max_frames * hop, (step, clip.size)
            else:
                assert clip.shape == (samples,), (tag, step, clip.shape)
                assert np.sqrt(np.mean(clip ** 2)) > 1e-3, (tag, step)


@pytest.mark.slow
def test_tiny_trains_on_ljspeech_length_clips(long_clip_run):
    """``train.py --model tacotron2 --tiny`` on clips of 6 to 10.2 s (the shared run): every clip is kept (the tiny
    max_mel_frames covers 10+ s), a few steps train, validation runs on a 6-9 s clip, exit 0."""
    corpus, out, said = long_clip_run
    assert sf.info(str(corpus / "wavs" / "SYN-0001.wav")).duration > 10
    assert "5 train / 1 val utterances" in said and "skipped" not in said, said
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == [1, 2] and all(np.isfinite(row["loss"]) for row in steps)
    validated = [json.loads(line) for line in (out / "val_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in validated] == [1, 2] and all(np.isfinite(row["val_loss"]) for row in validated)
    assert torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == 2


@pytest.mark.slow
def test_length_buckets_train_two_ranks_and_a_mid_epoch_resume_repeats_the_run(tmp_path):
    """``data.batching=buckets`` on 2 gloo ranks (``train.py``'s ``main`` in each, started by hand: what is proven is
    the training, not the launcher): the run states the padding it saves, and a checkpoint taken inside an epoch
    resumes to the same loss at every later step and the same weights as the run that went on."""
    import re
    import shutil

    from conftest import ROOT, bound, synth_corpus, train_on_ranks

    corpus = synth_corpus(tmp_path / "corpus", n=22, seconds=1.0, spread=(0.3, 2.0))  # 0.3 to 2 s

    def run(out, *extra):
        argv = ["--config", os.path.join(ROOT, "config.json"), "--model", "tacotron2", "--tiny", "--max-steps", "7",
                "--dataset-path", str(corpus), "--output-dir", str(out), "--set", "data.batching=buckets",
                "--set", "data.bucket_pool=10", "--set", "train.log_interval=1", *extra]
        output = train_on_ranks(argv, tmp_path / f"{out.name}_ranks", timeout=bound(300))[0]  # each rank exits 0
        return output, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    output, whole = run(tmp_path / "whole", "--set", "train.checkpoint_interval=3", "--set", "train.keep_last=5")
    bucketed, shuffled = map(float, re.search(r"([\d.]+)% of a batch is padding, against ([\d.]+)% in random",
                                              output).groups())
    assert bucketed < shuffled / 2, output
    state = torch.load(tmp_path / "whole" / "checkpoint_3.pt", map_location="cpu", weights_only=True)
    assert 0 < state["batch_in_epoch"], "the checkpoint must sit inside an epoch (20 utterances: 5 steps of 4)"
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(tmp_path / "whole" / "checkpoint_3.pt", resumed / "checkpoint_last.pt")
    output, rest = run(resumed, "--resume", "auto")
    assert "resumed from" in output and [r["step"] for r in rest] == [4, 5, 6, 7]  # across the epoch's end
    assert [r["loss"] for r in rest] == [r["loss"] for r in whole[3:]]
    final = [torch.load(folder / "checkpoint_last.pt", map_location="cpu", weights_only=True)["model"]
             for folder in (tmp_path / "whole", resumed)]
    assert all(torch.equal(final[0][key], final[1][key]) for key in final[0])


@pytest.mark.slow
def test_frame_budgets_resume_bit_exactly_after_sigterm_and_read_each_utterance_once_through_2_1_2(tmp_path,
                                                                                              monkeypatch):
    """``data.batching=frames`` on 2 gloo ranks (``train.py``'s ``main`` in each, started by hand), 21 training clips
    of 0.3 to 2 s (9 batches of 350 frames: 5 steps of 2 ranks): a run stopped by SIGTERM inside its first epoch
    resumes on 2 processes to the same losses, batches and weights as the run that went on; resumed on 1 process for
    a step (2 micro-batches), then on 2 again, the epoch reads each training utterance once, and each resume on
    another number of processes says the rest was planned afresh (:func:`conftest.frame_budgets_resume_through_2_1_2`)."""
    corpus = synth_corpus(tmp_path / "corpus", n=23, seconds=1.0, spread=(0.3, 2.0))  # 21 train, 2 val: uneven
    common = ["--config", os.path.join(ROOT, "config.json"), "--model", "tacotron2", "--tiny", "--dataset-path",
              str(corpus), "--set", "data.batching=frames", "--set", "data.max_frames=350",
              "--set", "train.log_interval=1"]
    frame_budgets_resume_through_2_1_2(tmp_path, monkeypatch, common, [f"SYN-{i:04d}" for i in range(1, 22)])


def test_a_frame_budget_below_the_longest_utterance_is_one_line_before_any_work(tmp_path):
    """``data.max_frames`` below the longest training clip (or below its cost with ``data.quadratic_frames``): one
    ERROR line naming the setting, the longest clip's frames and what to raise it to; no checkpoint."""
    from conftest import synth_corpus

    corpus = synth_corpus(tmp_path / "corpus", n=6)  # 5 train, 1 val (tiny: data.val_size 2, a tenth at least 1)
    longest = max(MelSpectrogram(AudioConfig(mel_framing="nvidia")).num_frames(sf.info(str(wav)).frames)
                  for wav in sorted((corpus / "wavs").glob("*.wav"))[:5])
    for budget, extra, said in ((longest - 1, "", f"({longest} mel frames): raise it to at least {longest}"),
                                (longest, "400", f"({longest} mel frames, {longest + longest ** 2 / 400:.0f} with "
                                                 f"data.quadratic_frames=400): raise it to at least "
                                                 f"{int(np.ceil(longest + longest ** 2 / 400))}")):
        code, out, err = run_train_main(["--config", "config.json", "--model", "tacotron2", "--tiny", "--max-steps",
                                         "1", "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                                         "--set", "data.num_workers=0", "--set", "data.batching=frames",
                                         "--set", f"data.max_frames={budget}",
                                         *(["--set", f"data.quadratic_frames={extra}"] if extra else [])])
        errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
        assert errors[0] == (f"ERROR: rank 0: data.max_frames={budget} is smaller than the longest training utterance "
                             f"{said}, or leave the longest utterances out")
        assert not (tmp_path / "out" / "checkpoint_last.pt").exists()


def test_a_max_mel_frames_that_leaves_no_utterance_is_one_line_naming_it(tmp_path):
    """Too small a ``tacotron2.max_mel_frames``: one ERROR line naming the setting, its value, how many clips
    are longer, the longest, and what to raise it to; no checkpoint."""
    corpus = long_clip_corpus(tmp_path / "corpus")
    longest = max(MelSpectrogram(AudioConfig(mel_framing="nvidia")).num_frames(sf.info(str(wav)).frames)
                  for wav in (corpus / "wavs").glob("*.wav"))  # train.py frames as Tacotron2's recipe: NVIDIA's
    code, out, err = run_train_main(["--config", "config.json", "--model", "tacotron2", "--tiny", "--max-steps", "1",
                                     "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                                     "--set", "data.num_workers=0", "--set", "tacotron2.max_mel_frames=400"])
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0] == (f"ERROR: rank 0: tacotron2.max_mel_frames is 400: 5 of 5 training utterances are longer "
                         f"(longest {longest} frames); no training utterances left: raise tacotron2.max_mel_frames "
                         f"to at least {longest}")
    assert not (tmp_path / "out" / "checkpoint_last.pt").exists()


def test_max_mel_frames_never_empties_the_validation_set_silently(tmp_path):
    """Short clips, one 3 s training clip and a 2 s validation clip: a limit that drops the 3 s clip is one warning
    line (how many, which setting and its value, the longest); one that drops the validation clip too is an error
    naming the setting, its value and the validation set."""
    from conftest import synth_corpus

    corpus = synth_corpus(tmp_path / "corpus", n=6, seconds=0.6)  # at most 0.72 s: 63 frames
    for index, seconds in ((2, 3.0), (6, 2.0)):
        wav = corpus / "wavs" / f"SYN-000{index}.wav"
        audio, rate = sf.read(wav, dtype="float32")
        sf.write(wav, np.resize(audio, int(seconds * rate)), rate, subtype="PCM_16")
    frames = {seconds: MelSpectrogram(AudioConfig()).num_frames(int(seconds * 22050))
              for seconds in (2.0, 3.0)}
    assert frames[2.0] > 100

    def datasets(max_mel_frames: int):
        from parts import config_schemas
        from utils.config import load_config

        cfg = load_config(Path(__file__).parent.parent / "config.json", config_schemas(), tiny=True,
                          overrides=[f"data.dataset_path={corpus}", f"tacotron2.max_mel_frames={max_mel_frames}",
                                     "tacotron2.mel_cache_dir=", "data.val_size=1"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return build_datasets(cfg), [str(warning.message) for warning in caught]

    (train_set, val_set), said = datasets(frames[2.0])
    assert (len(train_set), len(val_set)) == (4, 1) and train_set.skipped_ids == ["SYN-0002"]
    assert said == [f"TextMelDataset: skipped 1 of 5 training utterances (1 longer than tacotron2.max_mel_frames="
                    f"{frames[2.0]} mel frames, the longest {frames[3.0]}); raise the setting to keep them"]
    with pytest.raises(DataError) as caught:
        datasets(100)
    assert str(caught.value) == (f"tacotron2.max_mel_frames is 100: 1 of 1 validation utterances are longer (longest "
                                 f"{frames[2.0]} frames); no validation utterances left: raise "
                                 f"tacotron2.max_mel_frames to at least {frames[2.0]}")
    (train_set, val_set), said = datasets(0)  # 0: no limit
    assert (len(train_set), len(val_set), said) == (5, 1, [])


LARGER["tacotron2"] = {"encoder_n_convolutions": 10**9}  # its recorded config: 10^9 encoder layers


def test_a_recorded_config_of_a_billion_layers_is_one_line_before_it_is_allocated(tmp_path_factory):
    larger_refused(crafted_outcomes(tmp_path_factory), "tacotron2.encoder_n_convolutions")


@pytest.mark.parametrize("vocoder", ["waveglow", "hifigan"])
def test_text_to_speech_through_a_vocoder_checkpoint(tmp_path, vocoder):
    """``inference.py --text ... --vocoder VOCODER.pt`` (its command line in this process): Tacotron2's mel, vocoded
    by the other checkpoint."""
    from conftest import run_main, tiny_checkpoint

    from models import MODELS

    if vocoder not in MODELS:
        pytest.skip(f"this project has no {vocoder} model to chain")
    tts = tiny_checkpoint("tacotron2", tmp_path / "tacotron2.pt")
    voc = tiny_checkpoint(vocoder, tmp_path / f"{vocoder}.pt")
    run_main("inference", "--checkpoint", str(tts), "--text", "Hello there.", "--vocoder", str(voc), "--output",
             str(tmp_path / "t.wav"), "--device", "cpu")  # fails the test unless it exits 0
    info = sf.info(str(tmp_path / "t.wav"))
    assert info.samplerate == 22050 and info.frames > 0 and info.frames % 256 == 0


def test_settings_left_null_take_the_recipe():
    """NVIDIA's TacotronSTFT frames, grad_clip_thresh 1.0, no cuDNN autotuner (its lengths vary)."""
    check_recipe("tacotron2", *("nvidia", 1.0, False), optimizer=(1e-3, 1e-6))


def test_a_speaker_embedding_only_with_several_speakers_concatenated_to_the_encoder_outputs():
    """One speaker (or ``speaker_embedding_dim`` 0): no speaker table, and every weight drawn as before it existed;
    several: a ``(n_speakers, dim)`` table concatenated to the encoder outputs (Mellotron's), the decoder's attention
    memory that much wider, each speaker's batch decoded differently and a batch without speakers refused."""
    one = tiny_model()
    torch.manual_seed(0)
    single = Tacotron2(Tacotron2Config(**TINY), N_MELS, n_speakers=1)
    assert single.speaker_embedding is None and one.state_dict().keys() == single.state_dict().keys()
    assert all(torch.equal(value, single.state_dict()[key]) for key, value in one.state_dict().items())
    assert Tacotron2(Tacotron2Config(**{**TINY, "speaker_embedding_dim": 0}), N_MELS, 3).speaker_embedding is None
    torch.manual_seed(0)
    multi = Tacotron2(Tacotron2Config(**{**TINY, "speaker_embedding_dim": 6}), N_MELS, n_speakers=3).eval()
    assert tuple(multi.speaker_embedding.weight.shape) == (3, 6)
    assert multi.decoder.attention.memory_layer.in_features == TINY["encoder_embedding_dim"] + 6
    batch = tiny_batch()
    with torch.no_grad():
        outs = [multi({**batch, "speaker": torch.tensor([s, s])})["mel_postnet"] for s in (0, 2)]
    assert not torch.equal(*outs)
    with pytest.raises(ValueError, match="no 'speaker'"):
        multi(batch)


def test_items_and_batches_carry_the_speaker_index_only_with_a_map(tmp_path):
    """``TextMelDataset(speakers=...)``: each item's speaker index in the map, the collated batch a ``(B,)`` long
    ``speaker`` in its sorted order; without a map neither; a speaker the map lacks is one DataError line."""
    root = write_corpus(tmp_path / "c", {"U1": 0.3, "U2": 0.4, "U3": 0.5})
    corpus = Corpus.of(Utterance(u, str(root / "wavs" / f"{u}.wav"), f"Text {u} here.", spk, "", math.nan)
                       for u, spk in (("U1", "B"), ("U2", "A"), ("U3", "B")))
    with_map = TextMelDataset(corpus, AUDIO, speakers=["A", "B"])
    assert [with_map[i]["speaker"] for i in range(3)] == [1, 0, 1]
    batch = TextMelCollate()([with_map[0], with_map[1]])
    assert batch["speaker"].dtype == torch.long and batch["speaker"].tolist() == [1 if i == "U1" else 0
                                                                                 for i in batch["ids"]]
    plain = TextMelDataset(corpus, AUDIO)
    assert "speaker" not in plain[0] and "speaker" not in TextMelCollate()([plain[0], plain[1]])
    with pytest.raises(DataError, match="utterance 'U1': its speaker 'B' is not in the run's speaker map"):
        TextMelDataset(corpus, AUDIO, speakers=["A"])


def two_speaker_filelist(root: Path, lists: dict) -> Path:
    """A filelist corpus (``path|speaker|text``) of synthesized clips: ``lists`` maps a list file's name to the
    speakers of its lines, in order."""
    synth_corpus(root, n=max(len(speakers) for speakers in lists.values()), seconds=0.4)
    rows = [line.split("|") for line in (root / "metadata.csv").read_text().splitlines()]
    for name, speakers in lists.items():
        (root / name).write_text("".join(f"wavs/{utt}.wav|{speaker}|{text}\n"
                                         for (utt, text, _), speaker in zip(rows, speakers)))
    return root


@pytest.mark.slow
def test_a_two_speaker_run_on_two_ranks_keeps_its_map_and_speaks_each_voice(tmp_path):
    """2 steps of a 2-speaker Tacotron2 on 2 gloo ranks: ``speakers.json`` and the checkpoint hold the sorted map
    (and the model its table); ``inference.py --speaker`` speaks each voice differently, and refuses a missing or
    unknown name in one line; a resume on a corpus whose map differs is one ERROR line naming the first difference,
    the checkpoint untouched; ``--init-from`` on one with a new speaker appends it (said), its row new, the others
    kept (one step later: moved by about the learning rate)."""
    corpus = two_speaker_filelist(tmp_path / "corpus", {"train.txt": "ABABABAB", "val.txt": "AB",
                                                        "renamed.txt": "ACACACAC", "more.txt": "ABCABCAB"})
    out = tmp_path / "run"
    argv = ["--config", "config.json", "--model", "tacotron2", "--tiny", "--dataset-path", str(corpus),
            "--set", "data.format=filelist", "--set", "data.validation_files=val.txt", "--set", "data.num_workers=0"]
    train_on_ranks([*argv, "--set", "data.training_files=train.txt", "--max-steps", "2", "--output-dir", str(out)],
                   tmp_path / "ranks")
    assert json.loads((out / "speakers.json").read_text()) == {"A": 0, "B": 1}
    saved = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert saved["speakers"] == {"A": 0, "B": 1} and saved["model"]["speaker_embedding.weight"].shape == (2, 16)
    spoken = []
    for name in ("A", "B"):
        wav = tmp_path / f"{name}.wav"
        assert inference.main(["--checkpoint", str(out / "checkpoint_last.pt"), "--text", "The quick fox.",
                               "--output", str(wav), "--speaker", name]) == 0
        spoken.append(sf.read(wav)[0])
    assert len(spoken[0]) != len(spoken[1]) or not np.array_equal(*spoken)
    for extra, said in (([], "speaks 2 voices: give --speaker NAME (A, B)"),
                        (["--speaker", "Z"], "--speaker Z is not a speaker of")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert inference.main(["--checkpoint", str(out / "checkpoint_last.pt"), "--text", "Hi.", "--output",
                                   str(tmp_path / "x.wav"), *extra]) == 1
        assert [line for line in err.getvalue().splitlines() if line.startswith("ERROR")] == \
            [line for line in err.getvalue().splitlines() if said in line], err.getvalue()
    before = (out / "checkpoint_last.pt").read_bytes()
    code, _, err = run_train_main([*argv, "--set", "data.training_files=renamed.txt", "--max-steps", "3",
                                   "--output-dir", str(out)])
    errors = [line for line in err.splitlines() if line.startswith("ERROR")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in err, err
    assert "speaker map" in errors[0] and "index 1 is 'B' there, 'C' here" in errors[0], errors
    assert (out / "checkpoint_last.pt").read_bytes() == before
    grown = tmp_path / "grown"
    said = train_in_process([*argv, "--set", "data.training_files=more.txt", "--max-steps", "1", "--output-dir",
                             str(grown), "--init-from", str(out / "checkpoint_last.pt")])
    assert "1 new speaker(s) appended to its map of 2: C" in said
    table = torch.load(grown / "checkpoint_last.pt", weights_only=True)["model"]["speaker_embedding.weight"]
    # one Adam step moves a weight by about optimizer.lr (1e-3); a fresh row is drawn from N(0, 1)
    assert table.shape == (3, 16) and (table[:2] - saved["model"]["speaker_embedding.weight"]).abs().max() < 2e-3



def test_a_validation_split_of_no_training_speaker_validates_on_the_last_training_utterances(tmp_path):
    """A validation split none of whose speakers trains (LibriTTS's ``dev-*`` speakers are none of its training
    speakers): a multi-speaker model, which has no voice for them, validates on the last training utterances instead,
    said in one line, as a layout without a validation split does; one unknown speaker of two is left out."""
    corpus = two_speaker_filelist(tmp_path / "corpus", {"train.txt": "ABABABABABAB", "val.txt": "CD",
                                                        "mixed.txt": "CA"})
    data = {"dataset_path": str(corpus), "format": "filelist", "training_files": "train.txt",
            "validation_files": "val.txt", "speakers": ["A", "B"]}
    sections = {**SHARED_SECTIONS, "tacotron2": Tacotron2Config}
    model = {**TINY, "speaker_embedding_dim": 4}
    cfg = build_config({"audio": AUDIO.model_dump(), "data": data, "tacotron2": model}, sections)
    with pytest.warns(UserWarning, match=r"none of the 2 validation utterances is of a training speaker \(theirs: C, D\)"
                      r": the last 1 training utterances validate instead"):
        train, val = build_datasets(cfg)
    every = [line.split("|")[0] for line in (corpus / "train.txt").read_text().splitlines()]
    assert [utt.audio for utt in train.corpus] + [utt.audio for utt in val.corpus] == [str(corpus / p) for p in every]
    assert len(val) == 1
    mixed = build_config({"audio": AUDIO.model_dump(), "data": {**data, "validation_files": "mixed.txt"},
                          "tacotron2": model}, sections)
    with pytest.warns(UserWarning, match=r"left out 1 of 2 validation utterances: their speakers \(C\)"):
        train, val = build_datasets(mixed)
    assert (len(train), len(val)) == (12, 1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", VOICE_LAYOUTS)
def test_a_four_speaker_tacotron2_trains_on_each_layout_and_speaks_each_voice(layout, tmp_path, tmp_path_factory):
    """A 4-voice demo corpus in each layout, read by ``data.format=auto`` (8 utterances, 2 a voice: a layout that
    validates on its last utterance keeps every voice in training), then 1 step of Tacotron2 on it: on 2 gloo ranks
    for filelists, in this process for the others (the ranks' path proven once, each reader on its own).
    ``speakers.json`` and the checkpoint hold the 4 voices, sorted, and the model a 4-row speaker table; for filelists,
    ``inference.py --speaker`` speaks each voice differently. (The gate threshold is one no untrained gate reaches:
    every voice runs ``max_decoder_steps`` frames, where the default lets some stop at the first frame, which is
    silence whatever the voice.)"""
    corpus, out = demo_corpus(tmp_path_factory, layout, speakers=4, n=8), tmp_path / "run"
    argv = [*four_voice_argv("tacotron2", corpus, out, layout), "--set", "tacotron2.gate_threshold=0.999999",
            "--set", "tacotron2.max_decoder_steps=16", "--set", "audio.hop_length=1024"]  # a quarter of the frames
    said = "".join(train_on_ranks(argv, tmp_path / "ranks")) if layout == "filelist" else train_in_process(argv)
    voices = assert_four_voices("tacotron2", layout, out, said)
    if layout == "filelist":
        assert_speaks_each_voice(out / "checkpoint_last.pt", voices, tmp_path, "--text", "The quick fox.")
