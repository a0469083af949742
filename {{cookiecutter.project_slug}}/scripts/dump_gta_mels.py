"""Write Tacotron2's teacher-forced mel of every utterance of a corpus, to fine-tune a vocoder on what Tacotron2 says.

    python -m scripts.dump_gta_mels --checkpoint T2 --dataset-path D --output M [--batch-size N] [--device cpu|cuda]
    python multiproc.py --nproc-per-node 2 -m scripts.dump_gta_mels --checkpoint T2 --dataset-path D --output M
    python multiproc.py train.py --model VOCODER --dataset-path D --init-from VOCODER_CHECKPOINT --set data.mel_dir=M

The last line fine-tunes the vocoder on those mels. Method: Tacotron2's training forward pass, the decoder fed the
ground-truth mel (teacher forcing), so the post-net mel lines up with the real audio sample for sample ("ground
truth-aligned" mels: Shen et al., ICASSP 2018; jik876/hifi-gan's "Fine-Tuning"). Eval mode, the pre-net's dropout on
(masks from ``--seed``). Every file written is checked against the frame rule of the checkpoint's
``audio.mel_framing`` (``MelSpectrogram.num_frames``), which ``_audio_config.json`` records for the vocoder.

Written: ``<output>/<id>.pt`` for each utterance of both splits (resumable: those there are skipped unless
``--overwrite``), ``_audio_config.json`` and ``_gta_source.json``. Utterances longer than ``tacotron2.max_mel_frames``
(``--max-mel-frames``) are listed in ``_left_out.json``; they and unusable corpus lines are named in one line. Rank
``r`` of ``W`` processes writes utterances ``r, r + W, ...``. Errors: one ``ERROR:`` line each; exit status 2 for a
bad option, 1 for a problem of the run or of an utterance (the others are still written)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from distributed import all_gather_object, cleanup, from_rank0, init_distributed
from inference import load_trained, parse_device
from models.tacotron2.data import TextMelCollate, TextMelDataset, mel_cache_path
from models.tacotron2.text import text_to_sequence
from parts import PARTS
from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.config import Config, ConfigError
from utils.data.corpora import load_splits
from utils.data.corpus import BadClip, Corpus, DataError
from utils.data.mel_dir import LEFT_OUT_FILE, MEL_SETTINGS_FILE
from utils.data.sources import clip_samples, read_audio
from utils.framing import recorded_audio
from utils.launch import detect_launcher_env
from utils.run_log import one_line, one_line_warnings

SOURCE_FILE = "_gta_source.json"  # which weights the folder's mels come from (checkpoint path, SHA-256)
DIST_TIMEOUT_S = 24 * 3600.0  # seconds a rank waits for the others at the end (a resumed dump may be uneven)
RENDEZVOUS_TIMEOUT_S = 600.0  # seconds a rank waits for the others to join: one that failed early is not waited for
SHOWN_IDS = 10  # utterance ids named in a line about left-out utterances (then how many more)


class UsageError(ValueError):
    """A bad command line (argparse's message, on one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised, instead of usage and exit 2
        raise UsageError(f"{message} (python -m scripts.dump_gta_mels --help lists the options)")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """This script's command line.

    Raises:
        UsageError: an unknown, missing or malformed option (``--help`` still prints and exits 0)."""
    parser = _Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True,
                        help="a Tacotron2 checkpoint of train.py (a .pt file"
                             + (" or a sharded checkpoint folder)" if PARTS.formats.folder else ")"))
    parser.add_argument("--dataset-path", required=True,
                        help="the corpus's root folder (in a layout data.format reads; filelists: the checkpoint's, "
                             "inside it)")
    parser.add_argument("--output", required=True, help="folder for <id>.pt mels (created)")
    parser.add_argument("--batch-size", type=int, default=16, help="utterances per forward pass and process "
                        "(default 16)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (default: cuda when available; rank r of a multi-process job takes cuda:r)")
    parser.add_argument("--max-mel-frames", type=int, help="leave out longer utterances (default: the checkpoint's "
                        "tacotron2.max_mel_frames; 0: keep all)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the pre-net's dropout masks (default 1234)")
    parser.add_argument("--overwrite", action="store_true", help="compute the mels already in the folder again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_mel_frames is not None and args.max_mel_frames < 0:
        raise UsageError(f"--max-mel-frames must be >= 0 (0: keep all), got {args.max_mel_frames}")
    return args


def check_paths(args: argparse.Namespace) -> None:
    """The paths of the command line exist as what they must be (no file is read).

    Raises:
        CheckpointError, DataError: no ``--checkpoint``; ``--dataset-path`` is no folder, or ``--output`` a file."""
    if not Path(args.checkpoint).exists():
        raise CheckpointError(f"--checkpoint {args.checkpoint}: not found")
    if not Path(args.dataset_path).is_dir():
        raise DataError(f"--dataset-path {args.dataset_path}: not a folder")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise DataError(f"--output {args.output}: is a file; give a folder")


def check_command_line(argv: list[str]) -> Optional[str]:
    """``multiproc.py``'s question before it starts any rank: the first problem of the options and paths in one line,
    or ``None``."""
    try:
        check_paths(parse_args(argv))
    except (UsageError, CheckpointError, DataError) as err:
        return one_line(err)
    return None


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the model's state dict (names and bytes, in order): which weights a folder's mels come from."""
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        digest.update(key.encode())
        digest.update(value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy())
    return digest.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read {path}: {err}") from None


def prepare_output(output: Path, cfg: Config, source: dict, overwrite: bool) -> None:
    """Rank 0: make the output folder ready and write ``_audio_config.json`` (the audio settings: a vocoder refuses mels
    of others) and ``_gta_source.json`` (the checkpoint, a SHA-256 of its weights, the cleaners).

    Raises:
        DataError: the folder is Tacotron2's own mel cache, or (without ``overwrite``) holds mels of other audio
            settings, of other weights or cleaners, or ``.pt`` files this script did not write."""
    cache = mel_cache_path(cfg.data.dataset_path, cfg.tacotron2.mel_cache_dir)
    if cache is not None and cache.resolve() == output.resolve():
        raise DataError(f"--output {output} is Tacotron2's mel cache (tacotron2.mel_cache_dir), its training targets: "
                        "give another folder")
    audio = recorded_audio(cfg.audio.model_dump())
    if output.is_dir() and not overwrite:
        settings, recorded = output / MEL_SETTINGS_FILE, output / SOURCE_FILE
        before = _read_json(settings) if settings.is_file() else audio
        if not isinstance(before, dict) or recorded_audio(before) != audio:
            raise DataError(f"--output {output} holds mels of other audio settings ({settings}): give another folder, "
                            "or --overwrite to make them all again")
        if recorded.is_file():
            before = _read_json(recorded)
            before = before if isinstance(before, dict) else {}
            if any(before.get(key) != source[key] for key in ("weights_sha256", "text_cleaners")):
                raise DataError(f"--output {output} holds mels of other Tacotron2 weights or text cleaners (from "
                                f"{before.get('checkpoint')}): a vocoder would train on a mix; give another folder, or "
                                "--overwrite to make them all again")
        elif any(output.glob("*.pt")):
            raise DataError(f"--output {output} holds .pt files that this script did not write (no {SOURCE_FILE}): "
                            "give an empty or new folder, or --overwrite")
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(output / MEL_SETTINGS_FILE, (json.dumps(audio, indent=2) + "\n").encode())
    atomic_write_bytes(output / SOURCE_FILE, (json.dumps(source, indent=2) + "\n").encode())


def corpus(cfg: Config) -> tuple[Corpus, list[BadClip]]:
    """Every utterance of both splits once, in corpus order (training first), and the corpus lines left out.

    Raises:
        DataError: the corpus cannot be listed."""
    bad: list[BadClip] = []
    both = Corpus.join(load_splits(cfg.data, bad=bad))
    first = {utt_id: i for i, utt_id in reversed(list(enumerate(both.ids.tolist())))}
    return both.take(sorted(first.values())), bad


def header_samples(share: Corpus, sampling_rate: int) -> np.ndarray:
    """Each clip's samples at ``sampling_rate`` from durations and headers (to batch similar lengths); 0 where a
    header is unreadable (the error comes when it is loaded)."""
    try:
        return clip_samples(share, sampling_rate)
    except DataError:
        return np.array([_one_header(share.take([i]), sampling_rate) for i in range(len(share))], dtype=np.int64)


def _one_header(one: Corpus, sampling_rate: int) -> int:
    try:
        return int(clip_samples(one, sampling_rate)[0])
    except DataError:
        return 0


class GTAItems(Dataset):
    """Item ``i``: utterance ``i`` of ``text_mel`` as :class:`TextMelDataset` gives it, plus ``"samples"`` (its wav's
    length at ``audio.sampling_rate``) and ``"frames"`` (the frame rule's count), or ``{"id", "left_out": frames}``
    past ``max_frames``, or ``{"id", "error": line}`` when it cannot be read."""

    def __init__(self, text_mel: TextMelDataset, max_frames: Optional[int]):
        self.text_mel, self.max_frames, self.mel_fn = text_mel, max_frames, text_mel.mel_transform

    def __len__(self) -> int:
        return len(self.text_mel)

    def __getitem__(self, index: int) -> dict:
        utt = self.text_mel.corpus[index]
        try:
            samples = read_audio(utt.audio, self.text_mel.audio_cfg.sampling_rate).shape[0]
            frames = self.mel_fn.num_frames(samples)
            if samples < self.mel_fn.min_samples:
                raise DataError(f"{samples} samples, shorter than one STFT window ({self.mel_fn.min_samples})")
            if self.max_frames is not None and frames > self.max_frames:
                return {"id": utt.id, "left_out": frames}
            item = self.text_mel[index]
        except (DataError, ValueError) as err:
            return {"id": utt.id, "error": f"{utt.id}: {one_line(err)}"}
        return {**item, "samples": samples, "frames": frames}


def collate(items: list[dict]) -> dict:
    """Split a list of :class:`GTAItems` into the padded batch of the good ones (:class:`TextMelCollate`, or
    ``None``), their ``{id: (samples, frames)}``, the left-out ``[(id, frames)]`` and the error lines."""
    good = [item for item in items if "frames" in item]
    return {"batch": TextMelCollate()(good) if good else None,
            "lengths": {item["id"]: (item["samples"], item["frames"]) for item in good},
            "left_out": [(item["id"], item["left_out"]) for item in items if "left_out" in item],
            "errors": [item["error"] for item in items if "error" in item], "count": len(items)}


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, batch: dict, device: torch.device, seed: int) -> torch.Tensor:
    """The post-net mels ``(B, n_mels, T_max)`` float32 on the CPU of a :class:`TextMelCollate` batch, the decoder fed
    the batch's mels; the pre-net's dropout masks drawn from ``seed`` and the batch's ids."""
    torch.manual_seed((seed * 1_000_003 + zlib.crc32(",".join(batch["ids"]).encode())) % 2 ** 63)
    inputs = {key: batch[key].to(device) for key in ("text", "text_lengths", "mel", "mel_lengths")}
    return model(inputs)["mel_postnet"].float().cpu()


def dump_share(model: torch.nn.Module, cfg: Config, share: Corpus, output: Path, args: argparse.Namespace,
               device: torch.device, progress: bool) -> dict:
    """Write the mels of ``share`` (one rank's utterances) that are not there yet (all with ``--overwrite``), each
    ``(n_mels, frames)`` atomically; returns ``{"share", "written", "already", "left_out": [(id, frames)], "errors"}``.

    Raises:
        DataError, ValueError: the share's dataset cannot be built (a mel cache of other settings, an unknown cleaner).
        OSError: a mel cannot be written."""
    report: dict[str, Any] = {"share": len(share), "written": 0, "already": 0, "left_out": [], "errors": []}
    todo = []
    for i, utt in enumerate(share):
        if not args.overwrite and (output / f"{utt.id}.pt").is_file():
            report["already"] += 1
        elif not text_to_sequence(utt.text, cfg.tacotron2.text_cleaners):
            report["errors"].append(f"{utt.id}: no symbol of its transcript {utt.text!r} is in the symbol table")
        else:
            todo.append(i)
    bar = tqdm(total=len(todo), unit="utt", desc=f"GTA mels -> {output}", disable=not progress)
    if not todo:
        bar.close()
        return report
    max_frames = cfg.tacotron2.max_mel_frames if args.max_mel_frames is None else args.max_mel_frames
    todo = share.take(todo)
    text_mel = TextMelDataset(todo, cfg.audio, mel_cache_path(cfg.data.dataset_path, cfg.tacotron2.mel_cache_dir),
                              text_cleaners=cfg.tacotron2.text_cleaners)
    samples = header_samples(todo, cfg.audio.sampling_rate)
    order = sorted(range(len(todo)), key=lambda i: -samples[i])
    loader = DataLoader(GTAItems(text_mel, max_frames or None), batch_size=args.batch_size, sampler=order,
                        collate_fn=collate)
    model.mask_padding = True  # padded frames zeroed before every post-net layer: none reaches a kept frame
    try:
        for part in loader:
            report["left_out"] += part["left_out"]
            report["errors"] += part["errors"]
            batch = part["batch"]
            if batch is not None:
                mels = teacher_forced(model, batch, device, args.seed)
                for j, utt_id in enumerate(batch["ids"]):
                    made, (samples, expected) = int(batch["mel_lengths"][j]), part["lengths"][utt_id]
                    if made != expected:
                        report["errors"].append(
                            f"{utt_id}: Tacotron2's mel has {made} frames (those of its target mel), its audio "
                            f"({samples} samples at {cfg.audio.sampling_rate} Hz) gives {expected} by the frame rule; "
                            "the target mel (tacotron2.mel_cache_dir?) was made from other audio: redo it with "
                            "python -m scripts.preprocess --overwrite")
                        continue
                    buffer = io.BytesIO()  # a copy of the mel: a view would save its whole batch
                    torch.save(mels[j, :, :made].clone().contiguous(), buffer)
                    atomic_write_bytes(output / f"{utt_id}.pt", buffer.getvalue())
                    report["written"] += 1
            bar.update(part["count"])
    finally:
        bar.close()
    return report


def _ids(pairs: list, what: str) -> str:
    """``what`` with the first :data:`SHOWN_IDS` ids of ``pairs`` ``[(id, ...)]`` and how many more."""
    shown = ", ".join(str(pair[0]) for pair in pairs[:SHOWN_IDS])
    more = f" and {len(pairs) - SHOWN_IDS} more" if len(pairs) > SHOWN_IDS else ""
    return f"{what}: {shown}{more}"


def summarize(reports: list[dict], total: int, bad: list[BadClip], output: Path, max_frames: int) -> list[str]:
    """Rank 0's lines at the end: what was left out (one line per reason), the errors, then the summary."""
    lines = []
    left_out = sorted((pair for report in reports for pair in report.get("left_out", [])), key=lambda pair: pair[0])
    if left_out:
        lines.append("note: " + _ids(left_out, f"left out {len(left_out)} utterance(s) longer than "
                                     f"tacotron2.max_mel_frames={max_frames} mel frames (the longest "
                                     f"{max(frames for _, frames in left_out)})")
                     + f"; a vocoder on data.mel_dir={output} trains without them ({LEFT_OUT_FILE}), or dump them "
                       "with --max-mel-frames 0")
    if bad:
        lines.append("note: " + _ids([(clip.id,) for clip in bad], f"left out {len(bad)} corpus line(s) that name no "
                                     f"usable utterance (first: {bad[0].reason})"))
    for rank, report in enumerate(reports):
        if "fatal" in report:
            lines.append(f"ERROR: rank {rank}: {report['fatal']}")
        lines += [f"ERROR: {line}" for line in report.get("errors", [])]
    done = [report for report in reports if "fatal" not in report]
    counts = {key: sum(report[key] for report in done) for key in ("written", "already")}
    failed = sum(len(report.get("errors", [])) for report in reports)
    shares = ", ".join(f"rank {rank}: {report['written']} written + {report['already']} already there of "
                       f"{report['share']}" if "fatal" not in report else f"rank {rank}: failed"
                       for rank, report in enumerate(reports))
    lines.append(f"{total} utterances: {counts['written']} mels written, {counts['already']} already there, "
                 f"{len(left_out)} left out, {failed} failed -> {output} ({shares})")
    return lines


@dataclasses.dataclass
class Job:
    """What every rank knows before the dump: its place (``rank`` of ``world``), device, the checkpoint's model and
    config, the corpus (``bad``: lines left out) and the ``_gta_source.json`` record."""

    rank: int
    world: int
    device: torch.device
    model: torch.nn.Module
    cfg: Config
    utterances: Corpus
    bad: list[BadClip]
    source: dict


def prepare_job(args: argparse.Namespace) -> Job:
    """This rank's :class:`Job`: paths checked, launcher variables read, checkpoint loaded, corpus listed.

    Raises:
        CheckpointError: no checkpoint, an unreadable one, or one of another model.
        ConfigError, DataError, ValueError, OSError: its config, the corpus or the device cannot be used."""
    check_paths(args)
    env = detect_launcher_env(os.environ)
    device = parse_device(args.device)
    if device.type == "cuda" and env["world_size"] > 1:
        device = parse_device(f"cuda:{env['local_rank']}")
    name, model, cfg = load_trained(args.checkpoint, device)  # before any process group: shards put together here
    if name != "tacotron2":
        raise CheckpointError(f"--checkpoint {args.checkpoint} holds a {name} model; give a Tacotron2 checkpoint")
    cfg.data.dataset_path = str(args.dataset_path)
    utterances, bad = corpus(cfg)
    source = {"checkpoint": str(Path(args.checkpoint).resolve()), "weights_sha256": weights_sha256(model),
              "text_cleaners": list(cfg.tacotron2.text_cleaners)}
    return Job(env["rank"], env["world_size"], device, model, cfg, utterances, bad, source)


def dump_all(job: Job, output: Path, args: argparse.Namespace) -> Optional[list[dict]]:
    """Every rank: rank 0 makes the output folder ready, then each rank writes its share. Returns every rank's report
    (a share that failed as a whole: ``{"fatal": line, "share"}``), or ``None`` when the output folder cannot be used
    (rank 0 has said why in one ``ERROR:`` line)."""
    rank, world = job.rank, job.world
    try:
        from_rank0(lambda: prepare_output(output, job.cfg, job.source, args.overwrite), DataError, OSError)
    except (DataError, OSError) as err:
        if rank == 0:
            print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return None
    share = job.utterances.take(range(rank, len(job.utterances), world))
    print(f"rank {rank} of {world}: {len(share)} of {len(job.utterances)} utterances (numbers {rank}, {rank + world}, "
          f"... of the corpus list) on {job.device}", flush=True)
    try:
        report = dump_share(job.model, job.cfg, share, output, args, job.device,
                            progress=rank == 0 and not args.no_progress)
    except (DataError, ValueError, OSError) as err:
        report = {"fatal": one_line(err), "share": len(share)}
    return all_gather_object(report)


def run(args: argparse.Namespace) -> int:
    """:func:`main` once the options are read."""
    output = Path(args.output)
    try:
        job = prepare_job(args)
    except (CheckpointError, ConfigError, DataError, ValueError, OSError) as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    try:
        if job.world > 1:
            init_distributed(backend="gloo" if job.device.type == "cpu" else None, timeout_s=DIST_TIMEOUT_S,
                             rendezvous_timeout_s=RENDEZVOUS_TIMEOUT_S, check_environ=PARTS.check_environ)
    except (ValueError, RuntimeError) as err:  # launcher variables, a GPU that is not there, the rendezvous
        print(f"ERROR: rank {job.rank}: {one_line(err)}", file=sys.stderr)
        return 1
    try:
        reports = dump_all(job, output, args)
    finally:
        cleanup()
    if reports is None:
        return 1
    if job.rank == 0:
        max_frames = job.cfg.tacotron2.max_mel_frames if args.max_mel_frames is None else args.max_mel_frames
        left_out = {utt: frames for report in reports for utt, frames in report.get("left_out", [])}
        atomic_write_bytes(output / LEFT_OUT_FILE, json.dumps({"max_mel_frames": max_frames, "frames": left_out},
                                                              indent=1).encode())
        for line in summarize(reports, len(job.utterances), job.bad, output, max_frames):
            print(line, file=sys.stderr if line.startswith("ERROR") else sys.stdout, flush=True)
    failed = any("fatal" in report or report["errors"] for report in reports)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Dump the mels the command line asks for. Returns the exit status: 0; 2 for a bad option; 1 for a problem of
    the run or of an utterance (one ``ERROR:`` line each)."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 2
    with one_line_warnings():
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
