"""Build a small LJSpeech-layout corpus offline with a local text-to-speech engine (flite or espeak-ng).

    python -m scripts.make_demo_corpus --output data/demo --num-utterances 60

Writes ``DIR/metadata.csv`` (``id|text|text``) and ``DIR/wavs/LJ_DEMO_*.wav`` (16-bit mono PCM at ``--sampling-rate``
Hz) to smoke-test without LJSpeech; a sentence spoken again gets another voice or rate, ``--seed`` jitters it (+-5%).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import librosa
import numpy as np
import torch
from tqdm import tqdm

from utils.data.audio import load_wav, save_wav
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


def _synth_command(voice: Voice, text_file: Path, wav_file: Path) -> list[str]:
    """The command that speaks ``text_file`` into ``wav_file`` (a file: a sentence starting with '-' is no option)."""
    if voice.engine == "flite":
        return ["flite", *(["-voice", voice.name] if voice.name else []), "--setf",
                f"duration_stretch={1.0 / voice.speed:.3f}", "-f", str(text_file), "-o", str(wav_file)]
    return ["espeak-ng", "-v", voice.name or "en-us", "-s", str(round(ESPEAK_DEFAULT_WPM * voice.speed)),
            "-w", str(wav_file), "-f", str(text_file)]


def _prepare_output(output: Path, overwrite: bool) -> None:
    """Create ``output/wavs``; refuse a folder that already holds a corpus unless ``overwrite``."""
    if output.exists() and not output.is_dir():
        raise DemoCorpusError(f"--output {output} exists and is not a folder")
    if (output / "metadata.csv").exists():
        if not overwrite:
            raise DemoCorpusError(f"{output} already holds a metadata.csv; pass --overwrite to replace the corpus")
        (output / "metadata.csv").unlink()  # first: a failed rebuild never leaves metadata naming deleted wavs
        for old in (output / "wavs").glob("LJ_DEMO_*.wav"):
            old.unlink()
    (output / "wavs").mkdir(parents=True, exist_ok=True)


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


def make_corpus(args: argparse.Namespace) -> Path:
    """Speak ``args.num_utterances`` of :data:`DEMO_SENTENCES` into an LJSpeech-layout corpus at ``args.output``
    (``args.overwrite`` replaces one there), returned as a Path: utterance ``i`` speaks sentence
    ``i % len(DEMO_SENTENCES)``, each pass over them in the next voice and speed (normal, slower, faster), jittered.
    Raises DemoCorpusError for no engine, fewer than one utterance, a rate that is not positive, an existing corpus
    without ``overwrite``, or the engine failing (naming the utterance)."""
    output, sampling_rate, sentences = Path(args.output), args.sampling_rate, DEMO_SENTENCES
    if args.num_utterances < 1:
        raise DemoCorpusError(f"--num-utterances must be at least 1, got {args.num_utterances}")
    if sampling_rate <= 0:
        raise DemoCorpusError(f"--sampling-rate must be positive, got {sampling_rate}")
    engine = find_engine()
    names = _flite_voices() if engine == "flite" else list(ESPEAK_VOICES)
    voices = [Voice(engine, name, speed) for speed in SPEEDS for name in names]  # each at speed 1, slower, faster
    rng = random.Random(args.seed)
    _prepare_output(output, args.overwrite)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print("loading the resampler (librosa) ...", end=" ", flush=True)
        librosa.resample(np.zeros(1024, dtype=np.float32), orig_sr=16000, target_sr=sampling_rate)
        print("done", flush=True)
        for i in tqdm(range(args.num_utterances), desc=f"speaking with {engine}", unit="utt"):
            utt_id = f"LJ_DEMO_{i + 1:04d}"
            text = sentences[i % len(sentences)]
            voice = voices[(i // len(sentences)) % len(voices)]
            voice = dataclasses.replace(voice, speed=voice.speed * rng.uniform(1.0 - RATE_JITTER, 1.0 + RATE_JITTER))
            audio = _speak(voice, text, utt_id, Path(tmp), sampling_rate)
            save_wav(output / "wavs" / f"{utt_id}.wav", audio, sampling_rate)
            rows.append(f"{utt_id}|{text}|{text}\n")
    (output / "metadata.csv").write_text("".join(rows), encoding="utf-8")
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line entry point; returns the exit status (0 done, 1 error printed as one ``ERROR:`` line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path, help="corpus folder to create")
    parser.add_argument("--num-utterances", type=int, default=len(DEMO_SENTENCES),
                        help="number of wavs (default: one per sentence, 40)")
    parser.add_argument("--sampling-rate", type=int, default=22050, help="Hz of the written wavs")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the speaking-rate jitter")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --output")
    args = parser.parse_args(argv)
    try:
        output = make_corpus(args)
    except DemoCorpusError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.num_utterances} utterances to {output} (metadata.csv + wavs/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
