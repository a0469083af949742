"""Write a corpus as lhotse Shar shards, for corpora bigger than a disk: read in sequence, a shard at a time.

    python -m scripts.make_shards --dataset-path CORPUS --output FOLDER [--shard-size N] [--audio flac|original]
    python -m scripts.make_shards --dataset-path CORPUS --output s3://BUCKET/PREFIX ...

Reads the corpus as training does (``utils.data.corpora.load_splits``: ``data.format``, ``auto`` detection, the
layout's splits, ``data.exclude``; ``--config`` gives its ``data`` section, else the defaults) and writes each split
with lhotse's ``SharWriter`` (what ``CutSet.to_shar`` uses)::

    FOLDER/train/cuts.000000.jsonl.gz    a cut per utterance: its id, duration (seconds), the recording's
    FOLDER/train/recording.000000.tar      sampling rate, one supervision (text, speaker, language)
    FOLDER/val/...                       the validation split, the same way

``--shard-size`` cuts a shard (1000). ``--audio flac`` (the default) re-encodes every clip as FLAC (lossless: a
16-bit clip's samples read back the same), ``original`` in its own format (WAV, FLAC, ...); channels and sampling
rate stay as stored, a span of a longer recording (a lhotse cut, a NeMo offset) is cut out of it. Read back with
``lhotse.CutSet.from_shar(in_dir=FOLDER/train)``.

Each split is written to ``FOLDER/.SPLIT.partial``, both renamed when both are whole, so a ``FOLDER/train`` is never
half written; an existing ``FOLDER/train`` or ``FOLDER/val`` is refused, not overwritten. Bad input (no corpus, a clip that
cannot be read, an output that exists): one ``ERROR:`` line, exit status 1, the partial folder removed.

An ``s3://BUCKET/PREFIX`` output: the bucket is checked first (``utils.data.shar_store``: endpoint and credentials
from the environment alone, ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), the shards written to a temporary
folder, then uploaded to ``PREFIX/train`` and ``PREFIX/val`` (refused where either holds files already).
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import soundfile as sf
from lhotse import AudioSource, Recording, SupervisionSegment
from lhotse.cut import Cut
from lhotse.shar import SharWriter
from tqdm import tqdm

from parts import LEFT_OUT, DataSettings, config_schemas
from utils.config import ConfigError, load_config
from utils.data.corpora import load_splits, readers
from utils.data.corpus import Corpus, DataConfig, DataError, Utterance
from utils.data.shar_store import check_bucket, is_url, joined, listed, upload
from utils.data.sources import opened, parse, row_bytes

SPLITS = ("train", "val")
AUDIO_FORMATS = ("flac", "original")


def clip_recording(recording_id: str, clip: sf.SoundFile, kind: str, source: str | bytes) -> Recording:
    """The lhotse recording of the open ``clip`` (all of it, from its header: rate, samples, channels; duration
    ``samples / rate`` seconds, as ``soundfile.info`` gives it), its source ``kind`` ``file`` (a path) or ``memory``
    (the encoded bytes): the recording lhotse 1.33's ``Recording.from_file`` and ``Recording.from_bytes`` make, without
    their second read of the header."""
    return Recording(id=recording_id, sampling_rate=clip.samplerate, num_samples=clip.frames,
                     duration=clip.frames / clip.samplerate,
                     sources=[AudioSource(type=kind, channels=list(range(clip.channels)), source=source)])


def recording_of(utt: Utterance) -> Recording:
    """The lhotse recording of one utterance's audio (:func:`clip_recording`, its id the utterance's): a file whole
    (``utils.data.sources.opened``'s checks first: a file missing, a wav cut short), or a parquet row's bytes (none:
    DataError), each header read once. Raises DataError; ``soundfile.LibsndfileError``, ``RuntimeError`` or
    ``OSError``: unreadable."""
    path, row, _ = parse(utt.audio)
    if row is None:
        with opened(str(path)) as (clip, _):
            return clip_recording(utt.id, clip, "file", str(path))
    data = row_bytes(path, row)
    with sf.SoundFile(io.BytesIO(data)) as clip:
        return clip_recording(utt.id, clip, "memory", data)


def utterance_cut(utt: Utterance) -> Cut:
    """The lhotse cut of one utterance: its recording (:func:`recording_of`: a file, a span of one, or a parquet row's
    bytes), its duration (seconds, from the audio's header) and one supervision over all of it (text, speaker,
    language: None where unknown). DataError naming the utterance and its audio: missing, cut short or unreadable."""
    span = parse(utt.audio)[2]
    try:
        recording = recording_of(utt)
    except (DataError, sf.LibsndfileError, RuntimeError, OSError, ValueError) as err:
        raise DataError(f"cannot read the audio of utterance '{utt.id}': {utt.audio}: {err}") from None
    cut = recording.to_cut()
    if span is not None:
        cut = cut.truncate(offset=span[0], duration=min(span[1], recording.duration) - span[0], preserve_id=True)
    cut.supervisions = [SupervisionSegment(utt.id, utt.id, start=0.0, duration=cut.duration, text=utt.text,
                                           speaker=utt.speaker, language=utt.language or None)]
    return cut


def write_split(corpus: Corpus, folder: Path, shard_size: int, audio: str, bar: tqdm) -> int:
    """Write ``corpus`` as Shar shards of ``shard_size`` cuts into ``folder`` (made; ``audio``: ``flac`` or
    ``original``), advancing ``bar`` a cut at a time; the number of shards. Raises what :func:`utterance_cut` raises,
    and DataError where lhotse cannot decode or encode a clip."""
    folder.mkdir(parents=True)
    with SharWriter(str(folder), fields={"recording": audio}, shard_size=shard_size) as writer:
        for utt in corpus:
            cut = utterance_cut(utt)
            try:
                writer.write(cut)
            except (sf.LibsndfileError, RuntimeError, OSError, ValueError) as err:
                raise DataError(f"cannot write utterance '{utt.id}' ({utt.audio}) as {audio}: {err}") from None
            bar.update()
    return len(writer.output_paths["cuts"])


def make_shards(data: DataConfig, output: Path, shard_size: int = 1000, audio: str = "flac",
                progress: bool = True) -> dict[str, tuple[int, int]]:
    """Write the training and validation splits of ``data`` as Shar shards in ``output/train`` and ``output/val``
    (see the module); ``{split: (cuts, shards)}``. Raises DataError: the corpus cannot be read (what
    :func:`~utils.data.corpora.load_splits` raises), a clip cannot be written, or ``output/train`` or ``output/val``
    exists; the partial folders are removed then (and ``output``, where this call made it)."""
    for split in SPLITS:
        if (output / split).exists():
            raise DataError(f"{output / split} exists; remove it or give another --output (shards are not overwritten)")
    notes: list[str] = []
    splits = dict(zip(SPLITS, load_splits(data, notes=notes)))
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    partials, done, made = {split: output / f".{split}.partial" for split in SPLITS}, {}, not output.exists()
    try:
        with tqdm(total=sum(map(len, splits.values())), unit="cut", desc=f"shards -> {output}",
                  disable=not progress) as bar:
            for split, corpus in splits.items():
                shutil.rmtree(partials[split], ignore_errors=True)  # a run stopped before: its partial folder
                done[split] = (len(corpus), write_split(corpus, partials[split], shard_size, audio, bar))
    except BaseException:
        for partial in partials.values():
            shutil.rmtree(partial, ignore_errors=True)
        if made and output.is_dir() and not any(output.iterdir()):
            output.rmdir()  # the folder this run made, empty again
        raise
    for split, partial in partials.items():
        partial.rename(output / split)
    return done


def make_shards_to(data: DataConfig, url: str, shard_size: int = 1000, audio: str = "flac",
                   progress: bool = True) -> dict[str, tuple[int, int]]:
    """:func:`make_shards` into the S3 prefix ``url``: its bucket checked and ``url/train``, ``url/val`` found empty
    first, the shards written to a temporary folder (removed after), then uploaded. Raises DataError: what
    :func:`make_shards` and ``shar_store.upload`` raise, the bucket missing, shards under ``url`` already."""
    check_bucket(url)
    for split in SPLITS:
        if listed(joined(url, split)):
            raise DataError(f"{joined(url, split)} holds files; remove them or give another --output (shards "
                            "are not overwritten)")
    with tempfile.TemporaryDirectory(prefix="shards-") as folder:
        done = make_shards(data, Path(folder), shard_size, audio, progress)
        upload(Path(folder), url)
    return done


def data_section(args: argparse.Namespace) -> DataConfig:
    """The ``data`` section the command line names: ``--config``'s (``--dataset-path`` and ``--format`` override
    it), else the defaults with those two. Raises ConfigError: a format no reader has, a config that cannot be read or
    is refused."""
    overrides = [f"data.dataset_path={args.dataset_path}"] + ([f"data.format={args.format}"] if args.format else [])
    layouts = ["auto", *readers(DataSettings())]
    if args.format and args.format not in layouts:
        raise ConfigError(f"--format {args.format} is not a layout: give one of {', '.join(layouts)}")
    if args.config:
        return load_config(args.config, config_schemas(), overrides=overrides, left_out=LEFT_OUT).data
    return DataSettings(dataset_path=args.dataset_path, format=args.format or "auto")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write the shards the command line names. Returns the exit status."""
    parser = argparse.ArgumentParser(description="Write a corpus as lhotse Shar shards (FOLDER/train, FOLDER/val).")
    parser.add_argument("--dataset-path", required=True, help="the corpus's root folder (any layout data.format reads)")
    parser.add_argument("--output", required=True,
                        help="the folder or s3://BUCKET/PREFIX the shards go to (its train/ and val/ are made)")
    parser.add_argument("--shard-size", type=int, default=1000, help="cuts per shard (default: 1000)")
    parser.add_argument("--audio", choices=AUDIO_FORMATS, default="flac",
                        help="flac: every clip as FLAC (lossless); original: each in its own format")
    parser.add_argument("--config", help="config.json whose data section reads the corpus (default: the defaults)")
    parser.add_argument("--format", help="the corpus's layout, as data.format (default: the config's, else auto)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        if args.shard_size < 1:
            raise ConfigError(f"--shard-size must be at least 1, not {args.shard_size}")
        if "://" in args.output and not is_url(args.output):
            raise ConfigError(f"--output {args.output} is a URL S3 does not serve: give a folder or s3://BUCKET/PREFIX")
        write = make_shards_to if is_url(args.output) else make_shards
        output = args.output if is_url(args.output) else Path(args.output)
        done = write(data_section(args), output, args.shard_size, args.audio, not args.no_progress)
    except (ConfigError, DataError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(", ".join(f"{split}: {cuts} cuts in {shards} shard(s)" for split, (cuts, shards) in done.items())
          + f" written to {args.output} ({args.audio})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
