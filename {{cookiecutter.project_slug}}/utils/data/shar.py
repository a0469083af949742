"""Training from lhotse Shar shards (``data.format=shar``, ``--dataset-path`` the folder ``scripts/make_shards.py``
wrote: ``train/`` and ``val/``, in a folder or under an ``s3://bucket/prefix``: ``utils.data.shar_store``), for
corpora bigger than a disk. One of the corpora part's modules.

* The corpus check reads the cuts' metadata alone (``cuts.*.jsonl.gz``: ids, transcripts, speakers, durations), no
  audio: the model's datasets are built over it (``Training.datasets_of``), each item made of its cut's audio
  (``item(index, audio)``), decoded as the project decodes a file (:func:`cut_audio`).
* Training batches come from lhotse's own readers and sampler: ``CutSet.from_shar`` of each shard of the training
  split, read lazily, shard after shard (one that cannot be read: retried, then skipped with a warning line,
  ``shar_store.ReadShards``), and ``DynamicBucketingSampler`` (``data.max_duration`` seconds of audio per GPU per
  micro-batch, buckets of similar durations, shuffled by ``train.seed`` and the epoch, ``drop_last``, each rank its
  ``world_size``-th batch). The model's validation utterances are read whole into memory (they are few): the val
  split's cuts, and those of training utterances where the model validates on them, from the train split's last
  shards (:func:`validation_cuts`).
* Position: each micro-batch of every rank is one sample of the epoch's position (``samples_in_epoch``, as the
  checkpoints keep it): a resume on as many processes builds the epoch's sampler afresh and passes over the batches
  read, their cuts' metadata and audio bytes read again but not decoded (lhotse 1.33 restores its own sampler state
  the same way: a replay, not O(1)). Another number of processes plans other batches: a resume inside an epoch is
  refused, naming ``data.shar_restart_epoch``, which reads the interrupted epoch again from its start.
"""

from __future__ import annotations

import io
from itertools import islice
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ClassVar, Iterator, Literal, Mapping, NamedTuple, Optional, get_args

import soundfile as sf
import torch
from pydantic import Field, model_validator
from torch.utils.data import DataLoader, Dataset

from distributed import DistInfo
from model import ModelSpec
from utils.config import Config, ConfigError, Section, cross_check_error
from utils.data.audio import read_clip
from utils.data.corpora import lhotse, libritts, nemo, parquet, vctk
from utils.data.corpus import SINGLE_SPEAKER, Corpus, DataError, Layout, Utterance
from utils.data.loader import make_loader
from utils.data.shar_store import ReadShards, is_url, joined, read_ahead, read_errors, split_shards, warn
from utils.data.speakers import data_speakers
from utils.run import check_output_dir, ignore_stop_signals

SHAR = "shar"
SPLITS = ("train", "val")


class SharSettings(Section):
    """The ``data`` section's keys of this part (one of the bases of ``parts.DataSettings``)."""

    layouts: ClassVar[Mapping[str, ModuleType]] = {"vctk": vctk, "nemo": nemo, "lhotse": lhotse, "libritts": libritts,
                                                   "parquet": parquet}  # the layouts this part reads, in auto's order
    # the corpus's layout; auto: detected (the run's first lines say which); shar: lhotse Shar shards (train/, val/)
    format: Literal[(*get_args(Layout), SHAR)] = "auto"
    max_duration: float = Field(0.0, ge=0)  # shar: seconds of audio per GPU per micro-batch
    shar_restart_epoch: bool = False  # shar: a resume on another number of processes reads its epoch from the start

    @model_validator(mode="after")
    def shards_settings_agree(self) -> "SharSettings":
        """``format=shar`` has a ``max_duration``, ``data.batching=random`` (the shards are batched by duration; null:
        random, whatever the model's recipe) and no ``data.mel_dir`` (where the project has it)."""
        if self.format == SHAR and not self.max_duration:
            raise cross_check_error("config key 'data.max_duration' must be > 0 with data.format=shar: the seconds of "
                                    "audio a GPU takes per micro-batch", "format", "max_duration")
        if self.format == SHAR and getattr(self, "batching", None) is None:
            self.batching = "random"
        if self.format == SHAR and getattr(self, "batching", "random") != "random":
            raise cross_check_error(f"data.batching={self.batching} does not apply to data.format=shar, batched by "
                                    "data.max_duration: leave data.batching at random", "format", "batching")
        if self.format == SHAR and getattr(self, "mel_dir", ""):  # the after-training tools' key, where it is
            raise cross_check_error("data.mel_dir does not apply to data.format=shar, whose items are made of the "
                                    "shards' audio: leave data.mel_dir empty", "format", "mel_dir")
        return self


def _lhotse() -> Any:
    """The lhotse package, imported on first use (seconds): only a run on shards needs it."""
    import lhotse  # a heavy optional package: the runs on other layouts never load it

    return lhotse


def split_corpus(folder: str) -> Corpus:
    """The utterances of the Shar split ``folder`` (a folder or an S3 prefix) from its cuts' metadata alone
    (``cuts.*.jsonl.gz``, in order; no audio read): id, transcript, speaker (a corpus's one speaker where none) and
    language of each cut's first supervision, its duration (seconds); the audio source ``FOLDER#ID`` names the cut.
    DataError naming the folder or cut: no shards (what ``shar_store.split_shards`` raises), a file lhotse cannot
    read, a cut without a transcript."""
    files = [cuts for cuts, _ in split_shards(folder)]
    rows = []
    try:
        for cut in _lhotse().CutSet.from_shar(fields={"cuts": files}):
            said = cut.supervisions[0] if cut.supervisions else None
            if said is None or not (said.text or "").strip():
                raise DataError(f"{folder}: cut '{cut.id}' has no transcript (a supervision with text)")
            rows.append(Utterance(cut.id, f"{folder}#{cut.id}", said.text, said.speaker or SINGLE_SPEAKER,
                                  said.language or "", float(cut.duration)))
    except read_errors() as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{folder}: cannot read its cuts: {type(err).__name__}: {err}") from None
    return Corpus.of(rows)


def split_of(root: str, split: str) -> str:
    """The location of ``split`` (``train``, ``val``) under the Shar folder or S3 prefix ``root``
    (:func:`~utils.data.shar_store.joined`)."""
    return joined(root, split)


def read_splits(root: str) -> tuple[Corpus, Corpus]:
    """``(train, val)`` of the Shar folder or S3 prefix ``root`` (:func:`split_corpus` of ``root/train``,
    ``root/val``). DataError: a folder that does not exist, and what :func:`split_corpus` raises."""
    if not is_url(root) and not Path(root).is_dir():
        raise DataError(f"--dataset-path {root}: no such folder (data.format=shar reads the folder or s3:// prefix "
                        "python -m scripts.make_shards --output wrote)")
    train, val = (split_corpus(split_of(root, split)) for split in SPLITS)
    return train, val


def cut_audio(cut: Any, sampling_rate: int) -> torch.Tensor:
    """The sound of ``cut`` (its recording's bytes, as read from the shard) as ``utils.data.sources.read_audio``
    gives a file's: float32 ``(T,)`` in [-1, 1] at ``sampling_rate`` Hz, channels averaged, another rate resampled,
    the cut's span of the recording. DataError naming the cut and its shard: no audio in memory, or undecodable."""
    source = cut.recording.sources[0] if cut.recording is not None and cut.recording.sources else None
    name = f"cut '{cut.id}' of {cut.custom.get('shard_origin', 'its shard') if cut.custom else 'its shard'}"
    if source is None or source.type != "memory":
        raise DataError(f"{name}: no audio read with it (a Shar split holds a recording.*.tar beside each cuts file)")
    try:
        with sf.SoundFile(io.BytesIO(source.source)) as clip:
            first = min(round(cut.start * clip.samplerate), clip.frames)
            frames = max(0, min(clip.frames, first + round(cut.duration * clip.samplerate)) - first)
            clip.seek(first)
            return read_clip(clip, frames, sampling_rate, name)
    except (sf.LibsndfileError, RuntimeError) as err:
        raise DataError(f"cannot decode the audio of {name}: {err}") from None


def model_items(spec: ModelSpec, cfg: Config, splits: tuple[Corpus, Corpus]) -> tuple[Any, Any]:
    """The model's ``(train, val)`` datasets of ``splits`` (``Training.datasets_of``), each with ``item(index,
    audio)`` and ``corpus``. ConfigError: the model has no ``datasets_of``, or its datasets no ``item``."""
    if spec.training.datasets_of is None:
        raise ConfigError(f"data.format=shar: model '{spec.name}' gives no Training.datasets_of (its datasets of "
                          "given corpora, each item made of its audio); train it on a corpus layout")
    datasets = spec.training.datasets_of(cfg, splits)
    if not all(callable(getattr(dataset, "item", None)) and hasattr(dataset, "corpus") for dataset in datasets):
        raise ConfigError(f"data.format=shar: model '{spec.name}''s datasets have no item(index, audio) and corpus")
    return datasets


class CutBatches(Dataset):
    """lhotse's pattern of a dataset: ``dataset[cuts]`` (a CutSet, a batch the sampler planned) is the model's batch
    of their items, ``items.item(index, audio)`` each (:func:`cut_audio`), collated by ``collate``. ``len``: the
    model dataset's utterances; ``set_epoch`` is the model dataset's (its random crops)."""

    def __init__(self, items: Any, collate: Optional[Callable[[list], dict]], sampling_rate: int):
        self.items, self.collate, self.sampling_rate = items, collate, sampling_rate
        self.index = {utt: i for i, utt in enumerate(items.corpus.ids.tolist())}

    def __len__(self) -> int:
        return len(self.items)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.items, "set_epoch"):
            self.items.set_epoch(epoch)

    def __getitem__(self, cuts: Any) -> dict:
        made = [self.items.item(self.index[cut.id], cut_audio(cut, self.sampling_rate)) for cut in cuts]
        return self.collate(made) if self.collate is not None else torch.utils.data.default_collate(made)


class CutItems(Dataset):
    """Item ``i`` of the model dataset ``items`` made of the audio of its cut in ``cuts`` (id -> cut, read whole:
    :func:`validation_cuts`). DataError: an utterance of ``items`` without its cut."""

    def __init__(self, items: Any, cuts: dict[str, Any], sampling_rate: int):
        self.items, self.cuts, self.sampling_rate = items, cuts, sampling_rate
        missing = [utt for utt in items.corpus.ids.tolist() if utt not in cuts]
        if missing:
            raise DataError(f"data.format=shar: {len(missing)} validation utterance(s) have no cut in the val split "
                            f"nor the train split (the first: '{missing[0]}')")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items.item(index, cut_audio(self.cuts[self.items.corpus[index].id], self.sampling_rate))


class KeptIds:
    """``cut -> bool``: its id is one of ``ids`` (a lazy CutSet's filter; picklable, for the loader workers)."""

    def __init__(self, ids: set[str]):
        self.ids = ids

    def __call__(self, cut: Any) -> bool:
        return cut.id in self.ids


def validation_cuts(root: str, ids: list[str], say: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """The cuts of the validation utterances ``ids`` (id -> cut, its audio in memory) under the Shar folder or S3
    prefix ``root``: those of its val split's shards, then any it lacks from the train split's, its last shard first,
    until each is found: a model may validate on training utterances (a multi-speaker model's, where no validation
    speaker trains: the last ones). Shards read as :class:`~utils.data.shar_store.ReadShards` reads them (``say``: a
    shard skipped); an id found in neither is left out (:class:`CutItems` names it). DataError: what ``split_shards``
    raises."""
    from_shar, wanted = _lhotse().CutSet.from_shar, set(ids)
    cuts = {cut.id: cut for cut in ReadShards(split_shards(split_of(root, "val")), KeptIds(wanted), from_shar, say)}
    missing = wanted - cuts.keys()
    for shard in reversed(split_shards(split_of(root, "train")) if missing else []):
        cuts.update((cut.id, cut) for cut in ReadShards([shard], KeptIds(missing), from_shar, say))
        missing -= cuts.keys()
        if not missing:
            break
    return cuts


BUCKETS, BINS_FROM = 10, 10000
"""lhotse's defaults: duration buckets (at most the cuts), and the first cuts their bins are estimated from."""


class Length(NamedTuple):
    """What lhotse's ``estimate_duration_buckets`` reads of a cut (``TimeConstraint.measure_length``): its
    ``duration``, seconds."""

    duration: float


def duration_bins(kept: Corpus) -> list[float]:
    """The duration bins (seconds, ascending) lhotse's ``estimate_duration_buckets`` gives for ``min(BUCKETS,
    len(kept))`` buckets from the durations of the first :data:`BINS_FROM` utterances of ``kept``, which are those of
    the first kept cuts of the shards (``kept`` is in the shards' order); ``[]`` (one bucket) for fewer than 2
    utterances. From the metadata already read (:func:`split_corpus`): the shards are not read again for them."""
    buckets = min(BUCKETS, len(kept))  # lhotse's estimate needs a cut a bucket
    if buckets < 2:
        return []
    first = [Length(duration) for duration in kept.duration[:BINS_FROM].tolist()]
    return _lhotse().dataset.sampling.dynamic_bucketing.estimate_duration_buckets(first, buckets)


class ShardOrder:
    """This rank's batches (CutSets) of an epoch of the training split at ``folder`` (a folder or an S3 prefix, its
    shards read by :class:`~utils.data.shar_store.ReadShards`, rank 0 saying a shard skipped), its cuts of ``kept`` (the
    model dataset's utterances, in the shards' order: the model datasets leave utterances out, never reorder them):
    lhotse's ``DynamicBucketingSampler`` (``max_duration`` seconds a batch, shuffled by ``seed`` and the epoch,
    ``drop_last``, rank ``dist.rank`` of ``dist.world_size``), built afresh at each pass with the duration bins lhotse
    estimates, estimated once from ``kept``'s durations (:func:`duration_bins`; the shards not read for them). The
    batch stream's :class:`~utils.data.loader.OwnOrder`: a micro-batch of every rank is ``world_size`` samples;
    ``set_epoch(epoch, start=k)`` passes over this rank's first ``k // world_size`` batches (read, not decoded). The
    sampler, and with it the shards' reads, runs in a thread ``ahead`` batches ahead of the loader
    (:func:`~utils.data.shar_store.read_ahead`). ``restart``: ``data.shar_restart_epoch`` (False)."""

    def __init__(self, folder: str, kept: Corpus, max_duration: float, dist: DistInfo, seed: int, ahead: int = 2):
        lhotse, keep, shards = _lhotse(), KeptIds(set(kept.ids.tolist())), split_shards(folder)
        self.shards = ReadShards(shards, keep, lhotse.CutSet.from_shar, warn if dist.rank == 0 else None)
        self.cuts, self.bins = lhotse.CutSet(self.shards), duration_bins(kept)
        self.max_duration, self.seed, self.restart = max_duration, seed, False
        self.num_replicas, self.rank = dist.world_size, dist.rank
        self.step_samples = dist.world_size
        self.epoch, self.skip, self.ahead = 0, 0, ahead

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The pass of ``epoch`` from micro-batch ``start // world_size`` of each rank."""
        self.epoch, self.skip = epoch, start // self.num_replicas

    def epoch_read(self, samples: int) -> bool:
        """False: an epoch's batches are not counted ahead (its end is known when the next pass begins)."""
        return False

    def batch_line(self, micro_batches: int) -> str:
        """``up to N s of audio``: ``micro_batches`` of ``max_duration`` seconds."""
        return f"up to {self.max_duration * micro_batches:g} s of audio (data.max_duration={self.max_duration:g})"

    def resume_note(self, samples: int, written_by: int) -> Optional[str]:
        """None on as many processes or at an epoch's start; on another number the note that the epoch is read again
        from its start (``data.shar_restart_epoch``), else a ConfigError naming it."""
        if written_by == self.num_replicas or not samples:
            return None
        if not self.restart:
            raise ConfigError(f"the checkpoint was written by {written_by} process(es) inside an epoch, this run has "
                              f"{self.num_replicas}: lhotse's DynamicBucketingSampler cannot go on with another number "
                              f"of processes; resume on {written_by}, or set data.shar_restart_epoch=true to read the "
                              "epoch again from its start")
        return (f"note: the checkpoint was written by {written_by} process(es), this run has {self.num_replicas}: "
                "data.shar_restart_epoch=true reads the epoch again from its start")

    def __iter__(self) -> Iterator[Any]:
        sampler = _lhotse().dataset.DynamicBucketingSampler(
            self.cuts, max_duration=self.max_duration, duration_bins=self.bins, shuffle=True, drop_last=True,
            world_size=self.num_replicas, rank=self.rank, seed=self.seed)
        sampler.set_epoch(self.epoch)
        skip, self.skip = self.skip, 0
        yield from read_ahead(islice(sampler, skip, None), self.ahead)  # from the first batch asked for


def as_is(batch: dict) -> dict:
    """The DataLoader's collate of a batch :class:`CutBatches` made whole."""
    return batch


def check_budget(corpus: Corpus, max_duration: float, world_size: int) -> None:
    """ConfigError: the longest cut of the training ``corpus`` is over ``max_duration`` seconds (it would make no
    batch); DataError: fewer cuts than ``world_size`` processes (no batch for each)."""
    longest = float(corpus.duration.max(initial=0.0))
    if longest > max_duration:
        raise ConfigError(f"data.max_duration={max_duration:g} is shorter than the longest training cut ({longest:.2f} "
                          f"s): raise it to at least {longest:.2f}, or leave the longest cuts out")
    if len(corpus) < world_size:
        raise DataError(f"{len(corpus)} training cuts are too few for one each of {world_size} processes; add data")


class SharCorpus:
    """The core's ``OwnCorpus`` (``utils.training.setup``) for ``data.format=shar``: the check and the loaders."""

    def checked(self, cfg: Config, spec: ModelSpec, output_dir: Path) -> Optional[tuple[list[str], list[str]]]:
        """Rank 0's check of a Shar folder: the output folder writable, both splits' metadata readable; no id left
        out, the training split's speakers (sorted). None for another ``data.format``."""
        if cfg.data.format != SHAR:
            return None
        check_output_dir(output_dir)
        return [], data_speakers(read_splits(cfg.data.dataset_path)[0])

    def loaders(self, spec: ModelSpec, cfg: Config, dist: DistInfo) -> Optional[tuple[DataLoader, DataLoader]]:
        """This rank's training loader (:class:`CutBatches` over :class:`ShardOrder`'s batches of the lazy training
        split, those of the model's dataset kept) and validation loader (:class:`CutItems` of the model's validation
        utterances, their cuts read whole by :func:`validation_cuts`, batched as ``utils.data.loader.make_loader``
        batches validation). None for another ``data.format``."""
        if cfg.data.format != SHAR:
            return None
        root, rate = cfg.data.dataset_path, cfg.audio.sampling_rate
        splits = read_splits(root)
        train_set, val_set = model_items(spec, cfg, splits)
        check_budget(train_set.corpus, cfg.data.max_duration, dist.world_size)
        workers = cfg.data.num_workers
        order = ShardOrder(split_of(root, "train"), train_set.corpus, cfg.data.max_duration, dist, cfg.train.seed,
                           ahead=cfg.data.prefetch_factor * max(1, workers))  # as many as the loader keeps ready
        order.restart = cfg.data.shar_restart_epoch
        train = DataLoader(CutBatches(train_set, spec.training.collate_fn, rate), sampler=order, batch_size=None,
                           collate_fn=as_is, num_workers=workers, pin_memory=dist.device.type == "cuda",
                           prefetch_factor=cfg.data.prefetch_factor if workers else None,
                           generator=torch.Generator().manual_seed(cfg.train.seed + dist.rank),
                           worker_init_fn=ignore_stop_signals if workers else None,
                           persistent_workers=bool(workers) and cfg.data.persistent_workers)
        val_cuts = validation_cuts(root, val_set.corpus.ids.tolist(), warn if dist.rank == 0 else None)
        return train, make_loader(CutItems(val_set, val_cuts, rate), spec, cfg, dist, train=False)


SHAR_CORPUS = SharCorpus()
"""What ``parts.py`` hands the run (``RunParts.corpus``)."""
