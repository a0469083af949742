"""Build a small speech corpus offline with local text-to-speech engines (flite, espeak-ng), laid out as a real one.

    python -m scripts.make_demo_corpus --output data/demo --num-utterances 60
    python -m scripts.make_demo_corpus --output data/voices --layout filelist --speakers 4 --num-utterances 16

``--layout`` writes the tree of a layout the project reads, at its corpus's sampling rate (:data:`LAYOUTS`, each
reader module's ``DEMO``; the manual's "Corpora" shows each tree): LJSpeech-1.1 (the default: ``metadata.csv``
``id|text|text``, ``wavs/LJ_DEMO_*.wav``), VITS-style filelists (``path|speaker|text``), or a layout of a part.
Utterance ``i`` speaks sentence ``i % 40``, each pass over the sentences slower or faster, ``--seed`` jittering the rate
(+-5%). ``--speakers N`` gives it to speaker ``i % N``, speaker ``k`` always in the ``k``-th installed voice of
:data:`SPEAKER_VOICES`; one speaker (the default) reads each pass in the next voice, as this tool always did.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import librosa
import numpy as np
import torch
from tqdm import tqdm

from parts import DataSettings
from utils.data.audio import load_wav
from utils.data.corpora import READERS
from utils.data.corpora.demo import DemoLayout, Line, Speaker, validating, write_audio
from utils.data.corpus import DataError

ENGINES = ("flite", "espeak-ng")
FLITE_VOICES = ("slt", "rms", "awb", "kal16")  # 16 kHz voices worth varying (awb_time speaks clock times; kal: 8 kHz)
ESPEAK_VOICES = ("en-us", "en-us+f3", "en-gb", "en-gb+f2")
ESPEAK_DEFAULT_WPM = 175
SPEEDS = (1.0, 0.87, 1.12)  # speaking-rate factors, >1 is faster; one round of voices per factor
RATE_JITTER = 0.05  # each utterance's rate is also scaled by a seeded factor in [0.95, 1.05]

DEMO_SENTENCES = (
    "The morning train left the station exactly on time.", "A small boat drifted slowly across the quiet harbor.",
    "She wrote the numbers on the board, one after another.", "Nobody expected the old bridge to hold so much weight.",
    "Please close the window before the rain comes in.", "The library opens at nine and closes at six in the evening.",
    "He counted twelve sheep, then fell asleep in his chair.", "Fresh bread was sold in the market every Saturday.",
    "The committee will meet again next Thursday afternoon.", "Bright lights flickered along the edge of the river.",
    "Why would anyone leave a piano in the middle of a field?", "The letter arrived three weeks after it was sent.",
    "Farmers watched the sky and hoped for a gentle spring.", "A careful reader notices the smallest changes in tone.",
    "The engine coughed twice and then started with a roar.", "Her brother painted the fence a pale shade of green.",
    "Thunder rolled over the hills long into the night.", "They followed the narrow path until it reached the sea.",
    "The museum keeps a map that is four hundred years old.", "Every student was asked to read one chapter aloud.",
    "The clock in the tower struck midnight, and the town went still.",
    "A warm wind carried the smell of pine through the valley.", "The doctor said that a long walk would do him good.",
    "Could you tell me the way to the nearest post office?",
    "Seven ships sailed from the port in the first week of May.",
    "The kettle whistled while the guests took off their coats.",
    "Snow covered the roofs and muffled every sound in the street.",
    "The judge listened closely and asked only one question.",
    "Our neighbor grows tomatoes, beans, and a few tall sunflowers.",
    "The recording began with a short silence and a soft cough.",
    "Measured carefully, the table was just over two meters long.",
    "The children laughed when the dog chased its own tail.",
    "Workers repaired the road before the winter storms arrived.",
    "An old photograph showed the house as it looked in 1920.",
    "The speaker paused, smiled, and continued with her story.",
    "Heavy clouds gathered above the mountains in the west.", "The price of coffee rose sharply during the dry season.",
    "He kept his promise, even though it cost him a great deal.",
    "At the end of the hall stood a door painted bright red.",
    "The festival ended with music, dancing, and fireworks over the lake.",
)


class DemoCorpusError(RuntimeError):
    """The demo corpus cannot be built (no engine, bad arguments, a synthesis failure)."""


@dataclasses.dataclass(frozen=True)
class Voice:
    """Who speaks an utterance: ``engine``, voice ``name`` (``None``: the engine's default), ``speed`` (>1 faster)."""

    engine: str
    name: Optional[str]
    speed: float = 1.0


class SpeakerVoice(NamedTuple):
    """A voice one speaker of ``--speakers`` keeps, and what a layout's speaker table says of it: ``gender`` (F or M)
    and ``accent``."""

    voice: Voice
    gender: str
    accent: str


SPEAKER_VOICES = tuple(SpeakerVoice(Voice(engine, name), gender, accent) for engine, name, gender, accent in (
    ("flite", "slt", "F", "American"), ("flite", "rms", "M", "American"), ("flite", "awb", "M", "Scottish"),
    ("flite", "kal16", "M", "American"), ("espeak-ng", "en-us", "M", "American"),
    ("espeak-ng", "en-gb-x-rp+f4", "F", "English"), ("espeak-ng", "en-029+m7", "M", "Caribbean"),
    ("espeak-ng", "en-us+f5", "F", "American"), ("espeak-ng", "en-us+edward", "M", "American"),
    ("espeak-ng", "en-us+f1", "F", "American"), ("espeak-ng", "en-029+f3", "F", "Caribbean"),
    ("espeak-ng", "en-029", "M", "Caribbean")))
"""Speaker ``k``'s voice: the ``k``-th of these whose engine (and flite voice) is installed, so at most 4 speakers with
flite alone, 8 with espeak-ng alone, 12 with both."""


def find_engine() -> str:
    """flite if installed, else espeak-ng. Raises :class:`DemoCorpusError` when neither is."""
    for name in ENGINES:
        if shutil.which(name):
            return name
    raise DemoCorpusError("neither flite nor espeak-ng is installed (apt-get install flite)")


def _flite_voices() -> list[Optional[str]]:
    """The voices of :data:`FLITE_VOICES` this flite build has (``flite -lv``), or ``[None]`` (its default)."""
    result = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False)
    available = set(result.stdout.replace("Voices available:", "").split())
    return [voice for voice in FLITE_VOICES if voice in available] or [None]


def speaker_voices(count: int) -> list[SpeakerVoice]:
    """The first ``count`` of :data:`SPEAKER_VOICES` installed here, in its order. Raises :class:`DemoCorpusError`
    (naming what is installed) when fewer are."""
    flite = set(_flite_voices()) if shutil.which("flite") else set()
    found = [voice for voice in SPEAKER_VOICES if voice.voice.name in flite
             or (voice.voice.engine == "espeak-ng" and shutil.which("espeak-ng"))]
    found = found or [SpeakerVoice(Voice(find_engine(), None), "M", "American")]  # flite without those: its default
    if len(found) < count:
        names = ", ".join(f"{voice.voice.engine} {voice.voice.name}" for voice in found) or "none"
        raise DemoCorpusError(f"--speakers {count}: only {len(found)} distinct voice(s) are installed here ({names}); "
                              f"flite and espeak-ng together give {len(SPEAKER_VOICES)}")
    return found[:count]


def _synth_command(voice: Voice, text_file: Path, wav_file: Path) -> list[str]:
    """The command that speaks ``text_file`` into ``wav_file`` (a file: a sentence starting with '-' is no option)."""
    if voice.engine == "flite":
        return ["flite", *(["-voice", voice.name] if voice.name else []), "--setf",
                f"duration_stretch={1.0 / voice.speed:.3f}", "-f", str(text_file), "-o", str(wav_file)]
    return ["espeak-ng", "-v", voice.name or "en-us", "-s", str(round(ESPEAK_DEFAULT_WPM * voice.speed)),
            "-w", str(wav_file), "-f", str(text_file)]


def _speak(voice: Voice, text: str, utt_id: str, scratch: Path, sampling_rate: int) -> torch.Tensor:
    """``text`` spoken by ``voice`` (files in ``scratch``): float samples ``(T,)`` in [-1, 1] at ``sampling_rate`` Hz.
    Raises :class:`DemoCorpusError` naming ``utt_id`` if the engine fails or writes an unusable wav."""
    engine, text_file, raw_wav = voice.engine, scratch / "text.txt", scratch / "raw.wav"
    text_file.write_text(text + "\n", encoding="utf-8")
    result = subprocess.run(_synth_command(voice, text_file, raw_wav), capture_output=True, text=True, check=False)
    if result.returncode != 0 or not raw_wav.is_file():
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DemoCorpusError(f"{engine} failed on {utt_id} (exit {result.returncode}): {detail[0]}")
    try:
        audio = load_wav(raw_wav, sampling_rate)
    except DataError as err:
        raise DemoCorpusError(f"{engine} wrote an unusable wav for {utt_id}: {err}") from None
    raw_wav.unlink()
    return audio


LAYOUTS = {name: reader.DEMO for name, reader in {**READERS, **DataSettings.layouts}.items()}
"""Each ``--layout``, the layouts this project reads: its real corpus's sampling rate, names and files (each reader
module's ``DEMO``; the manual's "Corpora" shows each tree)."""


def _remove(output: Path, patterns: Sequence[str]) -> None:
    """Delete the files matching ``patterns`` under ``output``, then the folders that left empty."""
    folders: set[Path] = set()
    for pattern in patterns:
        for path in sorted(output.glob(pattern)):
            if path.is_file():
                path.unlink()
                folders.update(parent for parent in path.parents if output in parent.parents)
    for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def _prepare_output(output: Path, layout: DemoLayout, overwrite: bool) -> None:
    """Create ``output``; refuse a folder that already holds a corpus of ``layout`` unless ``overwrite``; remove its
    index (first: a failed rebuild never leaves an index naming deleted files), then its files."""
    if output.exists() and not output.is_dir():
        raise DemoCorpusError(f"--output {output} exists and is not a folder")
    held = [path for pattern in layout.index for path in sorted(output.glob(pattern))]
    if held and not overwrite:
        raise DemoCorpusError(f"{output} already holds a corpus ({held[0].relative_to(output)}); pass --overwrite to "
                              "replace it")
    _remove(output, layout.index)
    _remove(output, layout.data)
    output.mkdir(parents=True, exist_ok=True)


def _check_arguments(args: argparse.Namespace, layout: DemoLayout) -> None:
    """Raise :class:`DemoCorpusError` for arguments that cannot make a corpus of ``layout``."""
    count, speakers = args.num_utterances, args.speakers
    if count < 1:
        raise DemoCorpusError(f"--num-utterances must be at least 1, got {count}")
    if args.sampling_rate is not None and args.sampling_rate <= 0:
        raise DemoCorpusError(f"--sampling-rate must be positive, got {args.sampling_rate}")
    if not 1 <= speakers <= count:
        raise DemoCorpusError(f"--speakers must be between 1 and --num-utterances ({count}), got {speakers}")
    if layout.single and speakers > 1:
        raise DemoCorpusError(f"--layout {args.layout} has one speaker ({layout.single}); --speakers {speakers} needs "
                              "another layout: " + ", ".join(name for name, each in LAYOUTS.items() if not each.single))
    if layout.validates and count - validating(count) < speakers:
        raise DemoCorpusError(f"--layout {args.layout} validates on the last max(1, N // 10) utterances: "
                              f"--num-utterances {count} leaves a speaker of {speakers} none to train on")
    if layout.needs and importlib.util.find_spec(layout.needs) is None:
        raise DemoCorpusError(f"--layout {args.layout} needs the {layout.needs} package: pip install -r "
                              "requirements.txt")


def plan_lines(args: argparse.Namespace, layout: DemoLayout) -> tuple[list[Line], dict[str, Voice]]:
    """The ``args.num_utterances`` lines of the corpus: utterance ``i`` speaks sentence ``i % len(DEMO_SENTENCES)``,
    given to speaker ``i % args.speakers`` (named as ``layout.speakers`` name them); and each speaker's voice, by
    name. Raises :class:`DemoCorpusError` when fewer voices than speakers are installed, or the layout names fewer."""
    voices = speaker_voices(args.speakers)
    if len(voices) > len(layout.speakers):
        raise DemoCorpusError(f"--layout {args.layout} names {len(layout.speakers)} speakers, not {len(voices)}")
    speakers = [Speaker(name, chapter, each.gender, each.accent, f"{each.voice.engine} {each.voice.name}")
                for (name, chapter), each in zip(layout.speakers, voices)]
    lines = []
    for i in range(args.num_utterances):
        speaker, n = speakers[i % len(speakers)], i // len(speakers) + 1
        names = {"spk": speaker.name, "chapter": speaker.chapter, "i": i + 1, "n": n, "para": n - 1}
        utt_id, text = layout.id.format(**names), DEMO_SENTENCES[i % len(DEMO_SENTENCES)]
        lines.append(Line(utt_id, speaker, text, layout.audio.format(id=utt_id, **names)))
    return lines, {speaker.name: each.voice for speaker, each in zip(speakers, voices)}


def make_corpus(args: argparse.Namespace) -> Path:
    """Speak ``args.num_utterances`` of :data:`DEMO_SENTENCES` into a corpus of ``args.layout`` (:data:`LAYOUTS`) at
    ``args.output`` (``args.overwrite`` replaces one there), returned as a Path, at ``args.sampling_rate`` Hz (None: the
    layout's): :func:`plan_lines` says who speaks what; one speaker reads each pass over the sentences in the next
    voice and speed (normal, slower, faster), ``args.speakers`` > 1 each in their own voice; every rate jittered.
    Raises DemoCorpusError, before any file is written, for no engine, fewer than one utterance or fewer than
    ``args.speakers``, a rate that is not positive, more speakers than installed voices or than the layout holds, an
    existing corpus without ``overwrite``; and for the engine failing (naming the utterance)."""
    output, layout = Path(args.output), LAYOUTS[args.layout]
    _check_arguments(args, layout)
    sampling_rate, engine = args.sampling_rate or layout.rate, find_engine()
    lines, speaking = plan_lines(args, layout)
    names = _flite_voices() if engine == "flite" else list(ESPEAK_VOICES)
    voices = [Voice(engine, name, speed) for speed in SPEEDS for name in names]  # each at speed 1, slower, faster
    rng = random.Random(args.seed)
    _prepare_output(output, layout, args.overwrite)
    with tempfile.TemporaryDirectory() as tmp:
        scratch, table = Path(tmp), Path(tmp) / "table"
        print("loading the resampler (librosa) ...", end=" ", flush=True)
        librosa.resample(np.zeros(1024, dtype=np.float32), orig_sr=16000, target_sr=sampling_rate)
        print("done", flush=True)
        for i, line in enumerate(tqdm(lines, desc=f"speaking with {engine}", unit="utt")):
            passed = i // len(DEMO_SENTENCES)
            voice = (voices[passed % len(voices)] if args.speakers == 1 else
                     dataclasses.replace(speaking[line.speaker.name], speed=SPEEDS[passed % len(SPEEDS)]))
            voice = dataclasses.replace(voice, speed=voice.speed * rng.uniform(1.0 - RATE_JITTER, 1.0 + RATE_JITTER))
            audio = _speak(voice, line.text, line.id, scratch, sampling_rate)
            write_audio((table if layout.packed else output) / line.audio, audio.numpy(), sampling_rate)
        layout.write_index(output, lines, table)
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line entry point; returns the exit status (0 done, 1 error printed as one ``ERROR:`` line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path, help="corpus folder to create")
    parser.add_argument("--num-utterances", type=int, default=len(DEMO_SENTENCES),
                        help="number of utterances, all speakers together (default: one per sentence, 40)")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="ljspeech",
                        help="how the corpus ships (default: ljspeech)")
    parser.add_argument("--speakers", type=int, default=1, help="number of speakers, each its own voice (default: 1)")
    parser.add_argument("--sampling-rate", type=int, default=None,
                        help="Hz of the written audio (default: the layout's corpus's: " + ", ".join(
                            dict.fromkeys(f"{layout.corpus} {layout.rate}" for layout in LAYOUTS.values())) + ")")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the speaking-rate jitter")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --output")
    args = parser.parse_args(argv)
    try:
        output = make_corpus(args)
    except DemoCorpusError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    voices = f" of {args.speakers} speakers" if args.speakers > 1 else ""
    print(f"wrote {args.num_utterances} utterances{voices} to {output} ({LAYOUTS[args.layout].shows})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
