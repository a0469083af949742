"""lhotse manifests (icefall's and NeMo's recipes): CutSet JSON lines, possibly
gzipped, each cut a span of one recording with its supervisions (transcript, speaker, language), read with lhotse::

    libritts/libritts_cuts_train-clean-100.jsonl.gz    {"id": ..., "start": 0, "duration": 5.1, "recording":
    libritts/libritts_cuts_dev-clean.jsonl.gz            {"sources": [{"type": "file", "source": "..."}], ...},
                                                         "supervisions": [{"text": ..., "speaker": ...}], ...}

The manifests are ``data.training_files`` and ``data.validation_files`` (a file or a pattern), else the root's
``*cuts*.jsonl[.gz]``, split by their names (``dev``/``val``: validation, ``test``: not read). A recording's first
source is read with soundfile, its path relative to the manifest's folder (or absolute); lhotse's own loading is not
used, so a ``url`` or ``command`` source (which would fetch or run something) is refused, not followed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

from utils.data.corpora.common import Found, LineIssue, Part, audio_issue, repeated_id
from utils.data.corpora.demo import DemoLayout, Line
from utils.data.corpora.libritts import DEMO_ID
from utils.data.corpora.manifests import manifests_of
from utils.data.corpus import SINGLE_SPEAKER, BadClip, DataConfig, DataError, Utterance

TREE = "*cuts*.jsonl[.gz]: lhotse CutSet manifests"
KEPT_TRANSFORMS = {"Resample"}  # what the loader does anyway; any other transform of a recording is refused


def _manifests(root: Path) -> list[Path]:
    return sorted({*root.glob("*cuts*.jsonl"), *root.glob("*cuts*.jsonl.gz")})


def matches(root: Path) -> bool:
    """Whether ``root`` holds a ``*cuts*.jsonl`` or ``*cuts*.jsonl.gz`` manifest."""
    return bool(_manifests(root))


def _problem(cut: Any) -> Optional[str]:
    recording = getattr(cut, "recording", None)
    if recording is None:
        return f"a {type(cut).__name__} (only cuts of one recording are read)"
    if not recording.sources or recording.sources[0].type != "file":
        return f"its recording's source is of type '{recording.sources[0].type if recording.sources else None}' " \
               "(only 'file' is read)"
    others = [getattr(t, "name", None) or (t.get("name") if isinstance(t, dict) else type(t).__name__)
              for t in recording.transforms or ()]
    if set(others) - KEPT_TRANSFORMS:
        return f"its recording has transforms ({', '.join(map(str, others))}) that are not applied here"
    if not any((sup.text or "").strip() for sup in cut.supervisions):
        return "no supervision with a transcript"
    return None


def _utterance(cut: Any, manifest: Path) -> Utterance:
    """The utterance of one cut (checked by :func:`_problem`)."""
    recording, first = cut.recording, cut.supervisions[0]
    audio = manifest.parent / recording.sources[0].source  # an absolute path stays itself
    whole = cut.start == 0 and abs(cut.duration - recording.duration) < 1e-6
    source = str(audio) if whole else f"{audio}#t={cut.start},{cut.start + cut.duration}"
    text = " ".join(sup.text.strip() for sup in cut.supervisions if (sup.text or "").strip())
    return Utterance(cut.id, source, text, first.speaker or SINGLE_SPEAKER, first.language or "", float(cut.duration))


def _cuts(manifest: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, cut)`` of a cuts manifest, read lazily. DataError: unreadable, or not a CutSet's."""
    from lhotse import CutSet, load_manifest_lazy  # heavy (3 s): imported where it is used

    number = 0
    try:
        cuts = load_manifest_lazy(manifest)
        if isinstance(cuts, CutSet):
            for number, cut in enumerate(cuts, start=1):
                yield number, cut
    except (OSError, EOFError, ValueError, KeyError, TypeError) as err:  # gzip, JSON, a field missing or mistyped
        raise DataError(f"cannot read the lhotse manifest {manifest} (after {number} cuts): {err}") from None
    if not isinstance(cuts, CutSet):
        raise DataError(f"{manifest} is a lhotse {type(cuts).__name__}, not a CutSet (give the cuts manifest)")


def _scan(manifests: list[Path], first: dict[str, str]) -> Part:
    """The cuts of ``manifests`` in order, good ones as utterances, bad ones as issues (``first``: where each id was
    first given, across every split)."""
    rows, issues = [], []
    for manifest in manifests:
        for number, cut in _cuts(manifest):
            problem = _problem(cut)
            if problem is not None:
                issues.append(LineIssue(BadClip(cut.id, f"{manifest}:{number}", f"cut not read: {problem}"),
                                        f"{manifest}:{number}: cut '{cut.id}': {problem}"))
                continue
            utt = _utterance(cut, manifest)
            issue = repeated_id(utt.id, utt.audio, manifest, number, first[utt.id]) if utt.id in first else \
                audio_issue(utt.id, Path(utt.audio.split("#t=")[0]), manifest, number)
            first.setdefault(utt.id, f"{manifest.name} line {number}")
            if issue is not None:
                issues.append(issue)
                continue
            rows.append(utt)
    return Part(rows, issues, str(manifests[0] if len(manifests) == 1 else manifests[0].parent))


def read(root: Path, data: DataConfig) -> Found:
    """The cuts of the manifests (see the module): id, audio (``PATH#t=START,END`` where the cut is a span of its
    recording), the supervisions' transcripts joined, the first one's speaker (else :data:`SINGLE_SPEAKER`) and
    language, the cut's duration. DataError: no manifest, one named and not found, unreadable, or not of cuts."""
    train, val, notes = manifests_of(data, root, _manifests, "no lhotse cuts manifest to train on (*cuts*.jsonl[.gz])")
    first: dict[str, str] = {}
    return Found(_scan(train, first), _scan(val, first) if val else None, notes)


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: a lhotse CutSet (``cuts.jsonl.gz``), a recording (its path relative to the corpus
    folder) and one supervision (``text``, ``speaker``, ``language`` English) an utterance, written by lhotse itself."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet  # heavy (3 s)

    recordings = [Recording.from_file(output / line.audio, recording_id=line.id, relative_path_depth=3)
                  for line in lines]
    supervisions = [SupervisionSegment(id=line.id, recording_id=line.id, start=0.0, duration=recording.duration,
                                       channel=0, text=line.text, speaker=line.speaker.name, language="English")
                    for line, recording in zip(lines, recordings)]
    CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                          supervisions=SupervisionSet.from_segments(supervisions)).to_file(output / "cuts.jsonl.gz")


DEMO = DemoLayout(24000, DEMO_ID, "recordings/{spk}/{id}.wav", write_demo, ("cuts.jsonl.gz",), ("recordings/*/*.wav",),
                  needs="lhotse", shows="cuts.jsonl.gz + recordings/", corpus="LibriTTS")
"""A lhotse CutSet of LibriTTS's utterances, 24 kHz wavs."""
