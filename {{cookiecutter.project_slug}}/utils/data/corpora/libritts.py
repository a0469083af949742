"""LibriTTS and LibriTTS-R (Zen et al. 2019, Koizumi et al. 2023; 24 kHz), read from their subset folders::

    LibriTTS_R/train-clean-100/19/198/19_198_000000_000002.wav
    LibriTTS_R/train-clean-100/19/198/19_198_000000_000002.normalized.txt
    LibriTTS_R/dev-clean/...        (validates)      LibriTTS_R/test-clean/...  (not read)

``--dataset-path`` may also be one subset's folder (its speakers' folders in it).
"""

from __future__ import annotations

from pathlib import Path

from utils.data.corpora.common import Found, LineIssue, Part, audio_issue, text_issue
from utils.data.corpora.demo import DemoLayout, Line, write_text
from utils.data.corpora.manifests import apart
from utils.data.corpus import BadClip, DataConfig, DataError, Utterance

TREE = "<subset>/<speaker>/<chapter>/<id>.wav + <id>.normalized.txt"
TEXT = ".normalized.txt"


def _is_subset(folder: Path) -> bool:
    return next(folder.glob(f"*/*/*{TEXT}"), None) is not None


def matches(root: Path) -> bool:
    """Whether ``root`` is a subset (``<speaker>/<chapter>/*.normalized.txt``) or holds one."""
    return _is_subset(root) or next(root.glob(f"*/*/*/*{TEXT}"), None) is not None


def _transcript(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig").strip()
    except (UnicodeDecodeError, OSError) as err:
        raise DataError(f"cannot read the transcript {path}: {err}") from None


def _speaker(folder: Path, rows: list[Utterance], issues: list[LineIssue]) -> None:
    """The utterances of one speaker's folder (chapters, then ids, sorted) added to ``rows`` or ``issues``: a wav
    without a transcript or an empty one is an issue. DataError: the folder holds no transcript."""
    texts = sorted(folder.glob(f"*/*{TEXT}"))
    if not texts:
        raise DataError(f"LibriTTS speaker folder {folder} holds no transcript (<chapter>/<id>{TEXT}); remove the "
                        "folder, or give its speaker's transcripts")
    for path in texts:
        utt_id = path.name[:-len(TEXT)]
        audio = path.with_name(f"{utt_id}.wav")
        text = _transcript(path)
        issue = audio_issue(utt_id, audio, path) if text else text_issue(utt_id, str(audio), path)
        if issue is None:
            rows.append(Utterance(utt_id, str(audio), text, folder.name))
        else:
            issues.append(issue)
    told = {path.name[:-len(TEXT)] for path in texts}
    for wav in sorted(folder.glob("*/*.wav")):
        if wav.stem not in told:
            issues.append(LineIssue(BadClip(wav.stem, str(wav), f"no transcript {wav.stem}{TEXT}"),
                                    f"{wav}: no transcript {wav.stem}{TEXT} beside it"))


def _subset(folder: Path) -> Part:
    rows: list[Utterance] = []
    issues: list[LineIssue] = []
    for speaker in sorted(path for path in folder.iterdir() if path.is_dir()):
        _speaker(speaker, rows, issues)
    return Part(rows, issues, str(folder))


def _joined(parts: list[Part], root: Path) -> Part:
    return Part([row for part in parts for row in part.rows], [issue for part in parts for issue in part.issues],
                str(parts[0].where if len(parts) == 1 else root))


def read(root: Path, data: DataConfig) -> Found:
    """The subsets of ``root`` (or ``root`` as one): ``dev-*`` validate, ``test-*`` are not read (said), the others
    train, each in sorted order of speaker, chapter and id; without a ``dev-*`` subset no validation split. DataError:
    no training subset, a speaker folder with no transcript, a transcript unreadable."""
    if _is_subset(root):
        return Found(_subset(root), None, [])
    subsets = [folder for folder in root.iterdir() if folder.is_dir() and _is_subset(folder)]
    train, val, notes = apart(subsets, root)
    if not train:
        raise DataError(f"{root}: no LibriTTS training subset (only {', '.join(p.name for p in val)}); point "
                        "--dataset-path at the folder that holds train-clean-100/ (or such)")
    return Found(_joined([_subset(folder) for folder in train], root),
                 _joined([_subset(folder) for folder in val], root) if val else None, notes)


def write_demo(output: Path, lines: list[Line], _: Path) -> None:
    """The demo corpus's index: ``<id>.normalized.txt`` and ``.original.txt`` beside each wav,
    ``<spk>_<chapter>.trans.tsv`` in each chapter's folder, ``speakers.tsv`` at the top."""
    chapters: dict[Path, list[str]] = {}
    for line in lines:
        wav = output / line.audio
        for kind in ("normalized", "original"):
            write_text(wav.with_name(f"{line.id}.{kind}.txt"), line.text)
        chapters.setdefault(wav.parent, []).append(f"{line.id}\t{line.text}\t{line.text}\n")
    for folder, rows in chapters.items():
        write_text(folder / f"{folder.parent.name}_{folder.name}.trans.tsv", "".join(rows))
    speakers = dict.fromkeys(line.speaker for line in lines)
    write_text(output / "speakers.tsv", "READER\tGENDER\tSUBSET\tNAME\n" + "".join(
        f"{s.name}\t{s.gender}\ttrain-clean-100\t{s.voice}\n" for s in speakers))


DEMO_ID = "{spk}_{chapter}_{para:06d}_000000"
"""An utterance's id as LibriTTS names it (the LibriVox reader, chapter and paragraph), in the demo corpus."""
DEMO = DemoLayout(24000, DEMO_ID, "train-clean-100/{spk}/{chapter}/{id}.wav", write_demo, ("speakers.tsv",),
                  ("train-clean-100/*/*/*",), shows="speakers.tsv + train-clean-100/", corpus="LibriTTS")
"""LibriTTS's ``train-clean-100`` subset, 24 kHz wavs."""
