"""Helpers shared by the project's tests (pytest puts the project root on ``sys.path``: ``pytest.ini``).

* :data:`TEST_MODEL`: the model the generic tests (loop, resume, DDP, bad input) train: the environment
  variable ``TEST_MODEL`` if set, else the first registered model in alphabetical order, text-to-mel models (their
  inference takes a vocoder) last: their decoder steps once per mel frame, so a tiny job of theirs takes 2 to 3
  times a vocoder's CPU time, and the generic tests start a hundred jobs (their own test file trains them).
* :func:`clean_env`: the environment for a launched job, without the launcher variables of the machine
  running the tests, with GPUs hidden when there are fewer than the job's processes.
* :func:`finish`: wait for a launched job; on a timeout, show what is still running.
* :func:`tiny_checkpoint`: an untrained checkpoint of a model, for inference tests.
* :func:`free_port`, :func:`child_pids` / :func:`rank_pids`, :class:`OpensAFile`, :func:`synth_corpus`;
  :func:`layout_corpus`: a tiny multi-speaker corpus in one of the layouts the readers read (VCTK, LibriTTS, ...).
* :func:`train_with_validation_every_step` and :func:`tensorboard_audio`: the audio a run logs at validation.
* :func:`start_job`: a launched job, optionally with a planted ``sitecustomize.py`` (a fault, a slow step);
  :func:`run_ranks`: one script on 2 gloo ranks started by hand (no launcher; forked from a server that imported
  torch and the project once).
* :func:`perturbed_tiny_model`, :func:`old_weight_norm_names`, :func:`train_from_and_infer`: weights in other
  projects' formats (``--init-from``).
* :data:`START_DELAY_S`, :func:`process_start_s` and :func:`bound`: time limits that follow the machine.
* :func:`made_once`, :func:`shared_corpus`: a module's expensive fixture (a reference run, a corpus) made once per
  session, not once per pytest-xdist worker.
* :func:`write_checkpoints`: sharded checkpoint folders of ``TEST_MODEL`` written in this process.
* :func:`run_train_main`, :func:`train_in_process`: ``train.py`` inside the test's process, where what is proven is not
  the launch; :func:`run_main`: another command line of the project (``inference``, ``scripts.NAME``) likewise;
  :func:`mains_within`: several of them in one fresh process of bounded memory (what they allocate is tested).
* :func:`recorded_steps`: a run on 2 gloo ranks recording each step's utterances (SIGTERM inside a step, if asked);
  :func:`frame_budgets_resume_through_2_1_2`: a model's frame budgets resumed bit for bit and through 2 -> 1 -> 2
  processes (:func:`assert_same_weights`, :func:`metrics_rows`).
* :func:`four_voice_argv`, :func:`assert_four_voices`, :func:`assert_speaks_each_voice`: a model of several speakers
  trained on a 4-voice demo corpus in a layout (:data:`FOUR_VOICES`), and its voices spoken.

Time limits follow the machine, not a fast laptop. A GPU host starts every process slowly (CUDA and NCCL
initialisation take seconds) and ``pytest -n auto`` runs many jobs at once; so every bound on a job's wall time
is :func:`bound`: the job's own work plus a number of measured process starts. To see a GPU host's conditions on
any machine, plant a slow start in every process the tests launch::

    TEST_START_DELAY_S=3 python -m pytest -n 4 tests

(``TEST_START_DELAY_S``: seconds every launched Python process sleeps before it runs anything; the launcher, the
ranks it starts and their spawned workers alike.) Ports come from :func:`free_port`: below the kernel's ephemeral
range and split between pytest-xdist workers, so that no other test, worker or outgoing connection takes a port
between the moment a test picks it and the moment its job listens there.
"""

import atexit
import builtins
import contextlib
import functools
import importlib
import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import random
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import soundfile as sf
import torch
from filelock import FileLock
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from models import MODELS
from parts import LEFT_OUT, DataSettings, config_schemas
from scripts import make_demo_corpus
from utils.checkpoint.state import RngStates, TrainState
from utils.checkpoint.weights import load_into
from utils.config import load_config
from utils.data import corpora
from utils.data.corpora import filelist, ljspeech
from utils.data.corpus import DataConfig
from utils.training.recipe import apply_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
"""Test processes running at once (``pytest -n N``). Each takes its share of the cores for the work it does itself
(torch's intra-op threads; inductor compiles without a pool of its own): N workers each using every core, as
torch does by default, and each compiling with a pool as large as the machine, slow a many-core host down by an
order of magnitude. The jobs tests launch run one thread per process (:func:`clean_env`)."""
if XDIST_WORKERS > 1:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // XDIST_WORKERS))
    # train.py's main, which tests call in this process, gives the process a thread per CPU it may use unless
    # OMP_NUM_THREADS is set: it keeps this share. (Threads beyond a worker's share cost CPU for nothing: on 2 busy
    # cores, one intra-op thread too many spin-waits away five times the CPU of the work itself.)
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def made_once(tmp_path_factory, name: str, make):
    """``(folder, result)``: a fresh ``folder`` named ``name`` that ``make(folder)`` filled, and what it returned (a
    JSON value: tuples come back as lists, paths as strings), made once per test session and shared by every
    pytest-xdist worker, not once per worker.

    A module's fixture runs in each worker that runs one of its tests, so a fixture that trains a reference run
    would train it once per worker. Here the first worker to ask makes it under a file lock (``filelock``, the
    pattern of pytest-xdist's documentation) in the session's temporary folder; the others wait, then read the
    result and the folder, which no caller may change. Without pytest-xdist it is the session's own folder. A
    ``make`` that raises leaves no result: the next worker to ask starts again in a fresh folder (and most likely
    meets the same error, reported by its own test)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    folder, result = shared / f"once_{name}", shared / f"once_{name}.json"
    with FileLock(f"{folder}.lock"):
        if not result.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # what a make that raised left
            folder.mkdir()
            value = make(folder)
            result.write_text(json.dumps(value, default=str))
        return folder, json.loads(result.read_text())


def shared_corpus(tmp_path_factory, name: str, n: int) -> Path:
    """A :func:`synth_corpus` of ``n`` clips, made once per test session under the name ``name``
    (:func:`made_once`); no caller may change it."""
    def make(folder):
        synth_corpus(folder, n=n)
    return made_once(tmp_path_factory, name, make)[0]


def demo_corpus(tmp_path_factory, layout: str, speakers: int = 2, n: int = 4) -> Path:
    """A corpus of ``scripts.make_demo_corpus`` (speech of flite or espeak-ng) in ``layout`` (``vctk``, ``nemo``,
    ...): ``n`` utterances, ``speakers`` voices, made once per test session (:func:`made_once`); no caller may change
    it. Raises RuntimeError with the tool's error line if it cannot be made."""
    def make(folder):
        argv = ["--output", str(folder), "--layout", layout, "--speakers", str(speakers), "--num-utterances", str(n)]
        with contextlib.redirect_stderr(io.StringIO()) as said:
            if make_demo_corpus.main(argv) != 0:
                raise RuntimeError(said.getvalue().strip().splitlines()[-1])
    return made_once(tmp_path_factory, f"demo_{layout}_{speakers}x{n}", make)[0]


QUICK_BATCH, QUICK_CLIPS, QUICK_EPOCHS, QUICK_CLIP = 2, 8, 3, 1e-3
"""The shared quick-start run (:func:`quick_start_run`): per-rank batch (fixed: ``data.batching=random``, whatever
the model's recipe), training clips (2 steps an epoch on 2 ranks), epochs, and ``train.grad_clip`` (far below any tiny
model's gradient norm, so every update is clipped)."""
QUICK_STEPS = QUICK_EPOCHS * QUICK_CLIPS // (2 * QUICK_BATCH)

QUICK_RECORDER = '''
import os, sys
if os.environ.get("RANK") is not None and sys.argv[0].endswith("train.py"):  # a rank, not the launcher
    import atexit, json
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from utils.data import loader  # before train.py imports next_micro_batches from it
    read, seen, stepped = loader.next_micro_batches, [], []

    def reading(*args, **kwargs):  # the batches the loop trains on, as it receives them
        micro = read(*args, **kwargs)
        seen.append(list(micro[2]))
        return micro

    def before_step(optimizer, args, kwargs):  # the gradient the update is made from
        grads = [p.grad.detach().flatten() for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        stepped.append(float(torch.linalg.vector_norm(torch.cat(grads))))

    def save():
        with open(os.path.join(FOLDER, "rank" + os.environ["RANK"] + ".json"), "w") as file:
            json.dump({"ids": seen, "step_norms": stepped}, file)

    loader.next_micro_batches = reading
    register_optimizer_step_pre_hook(before_step)
    atexit.register(save)
'''
"""The recorder planted in the quick-start run's processes: each rank writes ``rank<RANK>.json`` into the run's folder
at exit, the utterance ids of every micro-batch the loop received and the norm of the gradient each optimizer step
used (a global optimizer pre-step hook); the loop's own code is left as it is."""


@pytest.fixture(scope="session")
def quick_start_run(tmp_path_factory) -> tuple[Path, int, str]:
    """``(folder, exit code, output)`` of the quick start in small, made once per session (:func:`made_once`) for
    test_smoke and test_wiring: ``multiproc.py --nproc-per-node 2 train.py`` of :data:`TEST_MODEL` (``--tiny``) for
    :data:`QUICK_STEPS` steps on ``folder/corpus`` (:data:`QUICK_CLIPS` training clips and 1 validation clip,
    validation every 3 steps), into ``folder/out``, with :data:`QUICK_RECORDER` planted. No caller may change it."""
    def make(folder):
        corpus = synth_corpus(folder / "corpus", n=QUICK_CLIPS + 1, seconds=0.3)  # the last validates
        argv = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir", str(folder / "out" / "logs"),
                "train.py", "--config", "config.json", "--model", TEST_MODEL, "--tiny", "--max-steps",
                str(QUICK_STEPS), "--dataset-path", str(corpus), "--output-dir", str(folder / "out")]
        for setting in ("data.val_size=1", "data.num_workers=0", f"{TEST_MODEL}.batch_size={QUICK_BATCH}",
                        "data.batching=random", "train.log_interval=1", "train.val_interval=3",
                        f"train.grad_clip={QUICK_CLIP}"):  # batches of QUICK_BATCH, whatever the model's recipe
            argv += ["--set", setting]
        plant = QUICK_RECORDER.replace("FOLDER", repr(str(folder)))
        return finish(start_job(argv, folder, nproc=2, plant=plant), timeout=bound(180))
    folder, (code, output) = made_once(tmp_path_factory, "quick_start_run", make)
    return folder, code, output


def vocoders_first(name: str) -> tuple[bool, str]:
    """The order the tests pick a model in: those that take no vocoder at inference (the quickest to train) first,
    then by name."""
    return bool(MODELS[name].inference and MODELS[name].inference.takes_vocoder), name


TEST_MODEL = os.environ.get("TEST_MODEL") or min(MODELS, key=vocoders_first, default=None)
if TEST_MODEL is not None and TEST_MODEL not in MODELS:
    raise pytest.UsageError(f"TEST_MODEL={TEST_MODEL} is not registered in models/__init__.py ({', '.join(MODELS)})")

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
                 "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST", "MULTIPROC_PID",
                 "MULTIPROC_STOP_TIMEOUT")
# torchrun's options (Kubeflow), SkyPilot's, Vertex AI's and SageMaker's variables: a test replays a platform by
# setting them itself; those of the machine running the tests (a CI pod, a cloud job) must not leak in.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PET_", "SKYPILOT_", "AIP_", "SM_")
IN_A_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
"""What every Kubernetes pod has in its environment (a test that replays a pod adds it to :func:`clean_env`'s)."""


START_DELAY_S = float(os.environ.get("TEST_START_DELAY_S") or 0)
"""Seconds every Python process launched by a test sleeps first (``TEST_START_DELAY_S``; 0: none)."""


def _sleep_first(seconds: float) -> str:
    """Python source that sleeps ``seconds`` (nothing for 0): the first lines of every planted ``sitecustomize``."""
    return f"import time\ntime.sleep({seconds!r})\n" if seconds > 0 else ""


@functools.cache
def _delay_plant() -> Optional[str]:
    """A folder holding a ``sitecustomize.py`` that sleeps :data:`START_DELAY_S` (removed at exit), or ``None``."""
    if START_DELAY_S <= 0:
        return None
    folder = tempfile.mkdtemp(prefix="slow-start-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    Path(folder, "sitecustomize.py").write_text(_sleep_first(START_DELAY_S))
    return folder


@functools.cache
def process_start_s() -> float:
    """Seconds a launched process of the project takes to be ready to work, measured once per test process:
    a fresh interpreter (with :data:`START_DELAY_S`) importing torch and the project's training modules, on this
    machine under its present load."""
    begin = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, distributed, train"], cwd=ROOT, env=clean_env(1),
                   check=True, capture_output=True)
    return time.monotonic() - begin


def bound(work_s: float, starts: int = 2) -> float:
    """A limit on a job's wall time: ``work_s`` seconds of its own work (generous: what an idle machine needs,
    several times over) plus ``starts`` process starts in sequence (:func:`process_start_s`, each counted twice:
    the machine is as busy when the job runs as when it was measured, or busier)."""
    return work_s + 2 * starts * process_start_s()


def start_up_wait() -> int:
    """A ``train.tracker_start_timeout_s`` (seconds) for a job whose trackers start, or give up early on their own: W&B's
    and MLflow's imports side by side in threads, and their starts, on this machine under the load of a whole suite.
    Generous (10 s and 6 process starts, each counted twice), since only a tracker that fails to start spends it."""
    return round(bound(10, starts=6))

def visible_gpus() -> int:
    """GPUs this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def clean_env(nproc: int = 2, cpu_only: bool = False, **extra: str) -> dict:
    """``os.environ`` for a job of ``nproc`` processes started by a test.

    Without the launcher variables of the machine running the tests (so a test run inside a SLURM job or
    under torchrun does not leak them), with the project on ``PYTHONPATH``, one OpenMP thread per process,
    unbuffered output, and ``CUDA_VISIBLE_DEVICES=""`` when fewer than ``nproc`` GPUs are visible (NCCL
    cannot put two ranks on one GPU, so such a job runs on the CPU with gloo) or with ``cpu_only``.
    ``extra`` is added last.
    """
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    path = [folder for folder in (_delay_plant(), ROOT, env.get("PYTHONPATH", "")) if folder is not None]
    env.update(PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if cpu_only or visible_gpus() < nproc:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return {**env, **extra}


PORTS = range(20000, 32000)
"""Where :func:`free_port` looks: below Linux's ephemeral range (32768-60999), where the kernel puts no outgoing
connection and no ``bind(port 0)``."""
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other test will be given: each pytest-xdist worker
    draws from its own slice of :data:`PORTS`, and never twice the same port.

    Raises:
        RuntimeError: every port of this worker's slice is taken.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    index = int(worker) if worker.isdigit() else 0
    share = len(PORTS) // max(workers, 1)
    candidates = [port for port in PORTS[index * share:(index + 1) * share] if port not in _handed_out]
    for port in random.sample(candidates, len(candidates)):
        _handed_out.add(port)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # another program's
                continue
            return port
    raise RuntimeError(f"no free port left in {PORTS.start + index * share}..{PORTS.start + (index + 1) * share - 1}")


def child_pids(parent_pid: int) -> list[int]:
    """Pids of the living direct children of ``parent_pid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while being read
        if ppid == parent_pid:
            found.append(int(entry.name))
    return found


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """``{rank: pid}`` of the training processes a launcher started (its children with ``RANK`` set)."""
    found = {}
    for pid in child_pids(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"RANK" in env:
            found[int(env[b"RANK"])] = pid
    return found


def alive(pids) -> list[int]:
    """Those of ``pids`` that are still running (not ended, not zombies waiting for their parent)."""
    found = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # ended
        if state != "Z":
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children, their DataLoader workers, ...), depth first."""
    found = []
    for child in child_pids(pid):
        found += [child, *descendants(child)]
    return found


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """Wait for a job started with ``start_new_session=True``: ``(exit code, output)``.

    Past ``timeout`` seconds, fails the test showing what was still running (the launcher, ranks or
    DataLoader workers holding the output pipe) and the output so far, then kills the whole session.
    """
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "--sid", str(proc.pid)],
                              capture_output=True, text=True).stdout
        launcher = "still running" if proc.poll() is None else f"exited {proc.returncode}"
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"job not finished after {timeout} s (launcher {launcher}); its processes:\n{tree}\n"
                    f"output:\n{output[-6000:]}")
    return proc.returncode, output


def tiny_checkpoint(name: str, path) -> Path:
    """An untrained checkpoint of model ``name`` in the tiny config, as ``inference.py`` reads it: enough to
    test its option handling without training (its config filled with the model's recipe, as train.py saves it).
    Returns ``path``."""
    cfg = apply_recipe(MODELS[name], load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True))
    torch.manual_seed(0)
    model = MODELS[name].build_model(cfg)
    torch.save({"model": model.state_dict(), "model_name": name, "config": cfg.to_dict(), "step": 0}, path)
    return Path(path)


def reframed_checkpoint(checkpoint, path, framing, entries: Optional[dict] = None) -> Path:
    """A copy at ``path`` of the checkpoint file ``checkpoint`` whose config records ``audio.mel_framing`` ``framing``
    (``...``: no such key, as before the setting existed), ``entries`` added or replaced (``source``, ``step``: as
    ``scripts.import_weights`` writes them). Returns ``path``."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    saved["config"]["audio"].pop("mel_framing")
    if framing is not ...:
        saved["config"]["audio"]["mel_framing"] = framing
    torch.save({**saved, **(entries or {})}, path)
    return Path(path)


def flip_tensor_bytes(path, count: int = 64) -> str:
    """Invert ``count`` bytes in the middle of the largest tensor record of the ``torch.save`` file ``path`` (a disk's
    or a copy's damage: ``torch.load`` still reads it); returns the record's name."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as handle:
        handle.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(handle.read(2), "little"), int.from_bytes(handle.read(2), "little")
        start = info.header_offset + 30 + name_len + extra_len + max(0, (info.file_size - count) // 2)
        handle.seek(start)
        data = bytes(b ^ 0xFF for b in handle.read(count))
        handle.seek(start)
        handle.write(data)
    return info.filename


class OpensAFile:
    """A pickled payload: unpickling it opens (creates) ``marker``. Loading it must be refused."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


@pytest.fixture
def fresh_dynamo():
    """Compile from scratch and count this test's graphs only (``torch._dynamo.utils.counters``). ``torch._dynamo``
    is loaded here, on first use (torch's lazy attribute): after ``TORCHINDUCTOR_COMPILE_THREADS`` is set above."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    yield counters
    torch._dynamo.reset()


@contextlib.contextmanager
def process_settings_kept():
    """Puts back, on leaving, what the fast paths and their checks set for the whole process: the TF32 and cuDNN flags
    (``utils.training.optim.setup_precision``), Inductor's ``fallback_random`` (eager's random numbers inside
    compiled code) and Dynamo's recompile limit (``optimize_for_training``), so no later test runs under this one's
    settings. Dynamo and Inductor are loaded here, on first use, as in :func:`fresh_dynamo`."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    backends = torch.backends
    flags = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.benchmark)
    with (inductor_config.patch(fallback_random=inductor_config.fallback_random),
          dynamo_config.patch(limit, getattr(dynamo_config, limit))):
        try:
            yield
        finally:
            backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.benchmark = flags


def synth_voice(rng: np.random.Generator, samples: int, sampling_rate: int) -> np.ndarray:
    """``(samples,)`` float32 of a voiced-sounding clip (harmonics of a gliding f0 under an envelope, a little noise),
    peak near 0.3."""
    t = np.arange(samples) / sampling_rate
    f0 = rng.uniform(90, 220) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sampling_rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = np.sin(np.pi * t / t[-1]) ** 2
    return (0.3 * envelope * voice / 2.6 + 0.005 * rng.standard_normal(t.size)).astype(np.float32)


LAYOUT_RATES = {"vctk": 48000, "libritts": 24000, "nemo": 44100, "parquet": 24000, "lhotse": 16000, "filelist": 22050}
"""The sampling rate each layout's corpus ships at (HiFi-TTS's 44.1 kHz for NeMo manifests; lhotse: any)."""


def layout_corpus(root, layout: str, speakers: tuple[str, ...] = ("1034", "2911"), per_speaker: int = 3,
                  seconds: float = 0.4, seed: int = 0) -> list[tuple[str, str, str, str, float]]:
    """Write a tiny corpus at ``root`` as ``layout``'s real corpora ship it (see each reader's module docstring), the
    last speaker's clips validating where the layout has splits, and a test split or speaker that is not read. Returns
    ``[(split, id, text, speaker, seconds)]`` of what a reader must find, in its order; every clip is voiced
    (:func:`synth_voice`) at :data:`LAYOUT_RATES`."""
    root, rng, rows = Path(root), np.random.default_rng(seed), []
    rate = LAYOUT_RATES[layout]
    for s, speaker in enumerate(speakers):
        split = "val" if s == len(speakers) - 1 else "train"
        for n in range(1, per_speaker + 1):
            utt = {"vctk": f"p{speaker}_{n:03d}", "libritts": f"{speaker}_100_{n:06d}_000000"}.get(layout,
                                                                                               f"{speaker}_{n:04d}")
            rows.append((split, utt, f"Speaker {speaker} says {['one', 'two', 'three', 'four'][n % 4]}.",
                         f"p{speaker}" if layout == "vctk" else speaker, round(seconds * rng.uniform(0.8, 1.2), 3)))
    write = {"vctk": _write_vctk, "libritts": _write_libritts, "nemo": _write_nemo, "parquet": _write_parquet,
             "lhotse": _write_lhotse, "filelist": _write_filelist}[layout]
    write(root, rows, lambda seconds: synth_voice(rng, int(seconds * rate), rate), rate)
    if layout == "nemo":  # its ids: the audio's path below the manifest, folders joined by _
        rows = [(split, f"audio_{speaker}_clean_10425_{utt}", text, speaker, seconds)
                for split, utt, text, speaker, seconds in rows]
    return rows if layout in ("nemo", "parquet", "lhotse", "filelist") else \
        [row for row in rows if row[0] == "train"] + [row for row in rows if row[0] == "val"]


def _write_vctk(root, rows, voice, rate):
    for _, utt, text, speaker, seconds in rows:
        (root / "txt" / speaker).mkdir(parents=True, exist_ok=True)
        (root / "wav48_silence_trimmed" / speaker).mkdir(parents=True, exist_ok=True)
        (root / "txt" / speaker / f"{utt}.txt").write_text(text + "\n")
        for mic in ("mic1", "mic2"):
            sf.write(root / "wav48_silence_trimmed" / speaker / f"{utt}_{mic}.flac", voice(seconds), rate)
    (root / "wav48_silence_trimmed" / "p315").mkdir()  # VCTK 0.92's speaker without transcripts
    sf.write(root / "wav48_silence_trimmed" / "p315" / "p315_001_mic1.flac", voice(0.3), rate)
    (root / "speaker-info.txt").write_text("ID  AGE  GENDER  ACCENTS  REGION COMMENTS\n" + "".join(
        f"{speaker[1:]}  23  F    English    Southern England\n" for speaker in sorted({row[3] for row in rows})))


def _write_libritts(root, rows, voice, rate):
    for split, utt, text, speaker, seconds in rows + [("test", "99_100_000001_000000", "Not read.", "99", 0.3)]:
        folder = root / {"train": "train-clean-100", "val": "dev-clean", "test": "test-clean"}[split] / speaker / "100"
        folder.mkdir(parents=True, exist_ok=True)
        sf.write(folder / f"{utt}.wav", voice(seconds), rate, subtype="PCM_16")
        (folder / f"{utt}.normalized.txt").write_text(text)
        (folder / f"{utt}.original.txt").write_text(text.upper())


def _write_nemo(root, rows, voice, rate):
    """HiFi-TTS's layout: a manifest per speaker and split, ``<speaker>_manifest_clean_<split>.json``, without a
    ``speaker`` field (the name says it)."""
    for split, utt, text, speaker, seconds in rows:
        audio = Path("audio") / f"{speaker}_clean" / "10425" / f"{utt}.flac"
        (root / audio).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / audio, voice(seconds), rate)
        entry = {"audio_filepath": str(audio), "duration": seconds, "text": text.upper(), "text_normalized": text}
        with open(root / f"{speaker}_manifest_clean_{'dev' if split == 'val' else split}.json", "a") as manifest:
            manifest.write(json.dumps(entry) + "\n")
    test = {"audio_filepath": f"audio/{rows[0][3]}_clean/10425/{rows[0][1]}.flac", "duration": 0.3, "text": "Not read."}
    (root / f"{rows[0][3]}_manifest_clean_test.json").write_text(json.dumps(test) + "\n")  # a test split: not read


def _write_parquet(root, rows, voice, rate):
    """A Hugging Face dataset's parquet files, as LibriTTS-R's on the Hub: ``audio`` (an ``Audio`` feature of wav
    bytes), ``text_normalized``, ``speaker_id``, ``id``."""
    import datasets  # only these tests' (4 s)

    datasets.disable_progress_bars()
    (root / "data").mkdir(parents=True)
    for split, name in (("train", "train.clean.100"), ("val", "dev.clean")):
        chosen = [row for row in rows if row[0] == split]
        clips = []
        for row in chosen:
            buffer = io.BytesIO()
            sf.write(buffer, voice(row[4]), rate, format="WAV", subtype="PCM_16")
            clips.append({"bytes": buffer.getvalue(), "path": f"{row[1]}.wav"})
        table = datasets.Dataset.from_dict({"audio": clips, "text_normalized": [row[2] for row in chosen],
                                            "speaker_id": [row[3] for row in chosen], "id": [row[1] for row in chosen]})
        table.cast_column("audio", datasets.Audio(sampling_rate=rate)).to_parquet(
            root / "data" / f"{name}-00000-of-00001.parquet")


def _write_lhotse(root, rows, voice, rate):
    """lhotse CutSet manifests (``cuts_train.jsonl.gz``, ``cuts_dev.jsonl.gz``); each cut a span of a longer
    recording (0.1 s of silence on each side), its supervision's speaker, text and language."""
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment  # only these tests' (3 s)

    (root / "audio").mkdir(parents=True)
    for split in ("train", "dev"):
        cuts = []
        for _, utt, text, speaker, seconds in (row for row in rows if row[0] == ("val" if split == "dev" else split)):
            pad = np.zeros(int(0.1 * rate), np.float32)
            sf.write(root / "audio" / f"{utt}.flac", np.concatenate([pad, voice(seconds), pad]), rate)
            recording = Recording.from_file(root / "audio" / f"{utt}.flac", recording_id=utt)
            recording.sources[0].source = f"audio/{utt}.flac"  # relative to the manifest's folder
            supervision = SupervisionSegment(id=utt, recording_id=utt, start=0.1, duration=seconds, text=text,
                                             speaker=speaker, language="English")
            cuts.append(MonoCut(id=utt, start=0.1, duration=seconds, channel=0, recording=recording,
                                supervisions=[supervision]))
        CutSet.from_cuts(cuts).to_file(root / f"cuts_{split}.jsonl.gz")


def _write_filelist(root, rows, voice, rate):
    """VITS-style lists ``path|speaker|text``: ``train.txt`` and ``val.txt``."""
    for split in ("train", "val"):
        lines = []
        for _, utt, text, speaker, seconds in (row for row in rows if row[0] == split):
            (root / "wavs" / speaker).mkdir(parents=True, exist_ok=True)
            sf.write(root / "wavs" / speaker / f"{utt}.wav", voice(seconds), rate, subtype="PCM_16")
            lines.append(f"wavs/{speaker}/{utt}.wav|{speaker}|{text}\n")
        (root / f"{split}.txt").write_text("".join(lines))


def synth_corpus(root, n: int = 24, seconds: float = 0.6, sampling_rate: int = 22050, seed: int = 0,
                 loud_noise: tuple[str, ...] = (), spread: tuple[float, float] = (0.8, 1.2)):
    """Write an LJSpeech-layout corpus of ``n`` voiced-sounding clips (harmonics of a gliding f0 under an
    envelope, plus a little noise) with short transcripts; returns the folder. No TTS engine needed. Each clip
    lasts ``seconds`` times a factor drawn uniformly from ``spread``.

    ``loud_noise``: utterance ids (``SYN-0015``) whose audio is replaced by loud white noise (standard deviation
    0.5 of full scale, clipped at 0.99; the voiced clips peak near 0.3), a damaged clip in the middle of a corpus.
    """
    root = Path(root)
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again"]
    lines = []
    for i in range(n):
        audio = synth_voice(rng, int(seconds * sampling_rate * rng.uniform(*spread)), sampling_rate)
        utt = f"SYN-{i + 1:04d}"
        if utt in loud_noise:
            audio = np.clip(0.5 * rng.standard_normal(audio.size), -0.99, 0.99)
        sf.write(root / "wavs" / f"{utt}.wav", audio.astype(np.float32), sampling_rate, subtype="PCM_16")
        text = " ".join(rng.choice(words, size=rng.integers(2, 6))).capitalize() + "."
        lines.append(f"{utt}|{text}|{text}\n")
    (root / "metadata.csv").write_text("".join(lines))
    return root


def read_ljspeech(root, bad: Optional[list] = None) -> list:
    """Every utterance of an LJSpeech-layout corpus (``load_splits`` before it splits): a bad row goes to ``bad`` as a
    ``BadClip``, or without ``bad`` raises ``DataError``."""
    corpora.detect(DataConfig(dataset_path=str(root), format="ljspeech"))  # the folder is there
    return list(corpora._settle(ljspeech.read(Path(root), DataConfig()).train, bad, frozenset()))


def read_filelist(filelist_path, root, bad: Optional[list] = None) -> list:
    """Every utterance of a filelist (``path|text`` or ``path|speaker|text``, paths relative to ``root``), as
    :func:`read_ljspeech`."""
    return list(corpora._settle(filelist.scan(Path(filelist_path), Path(root)), bad, frozenset()))


def train_with_validation_every_step(model: str, corpus, out, *settings: str) -> str:
    """``train.py``'s run (in this process: :func:`train_in_process`; what the tests read is what the run logs, not
    its process): tiny config, 2 steps, a validation after each, and ``settings`` (``--set`` values); its output."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    return train_in_process(["--config", "config.json", "--model", model, "--tiny", "--max-steps", "2",
                             "--dataset-path", str(corpus), "--output-dir", str(out), "--set", "train.val_interval=1",
                             "--set", "data.num_workers=0", *sets])


def tensorboard_audio(run_dir) -> dict:
    """``{tag: [(step, sample rate in Hz, samples (T,) float32 in [-1, 1]), ...]}`` of a run's TensorBoard log."""
    events = EventAccumulator(str(Path(run_dir) / "tensorboard"), size_guidance={"audio": 0})
    events.Reload()
    clips = {}
    for tag in events.Tags()["audio"]:
        for event in events.Audio(tag):
            samples, rate = sf.read(io.BytesIO(event.encoded_audio_string), dtype="float32")
            assert rate == event.sample_rate and samples.ndim == 1
            clips.setdefault(tag, []).append((event.step, rate, samples))
    return clips


def start_job(cmd: list, out, nproc: int, plant: Optional[str] = None) -> subprocess.Popen:
    """Start ``cmd`` in the project folder as a job of ``nproc`` processes (:func:`clean_env`), output merged, in a
    session of its own. ``plant``: the text of a ``sitecustomize.py`` every process of the job runs first (put in
    ``out/plant``)."""
    env = clean_env(nproc)
    if plant is not None:
        planted(out, plant, env)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def planted(out, plant: str, env: dict) -> dict:
    """Put ``plant`` (Python source) in ``out/plant/sitecustomize.py`` and that folder first on ``env``'s
    ``PYTHONPATH``, so that every process started with ``env`` runs it first (after :data:`START_DELAY_S`, which
    it keeps); a plant that raises ends the process with exit status 97. Returns ``env``, changed in place."""
    folder = Path(out) / "plant"
    folder.mkdir(parents=True, exist_ok=True)
    # Python reports an error in sitecustomize and runs on without it: a plant that fails must end the process.
    (folder / "sitecustomize.py").write_text(
        _sleep_first(START_DELAY_S) + "try:\n"
        f"    exec(compile({plant!r}, 'planted sitecustomize', 'exec'), globals())\n"
        "except BaseException:\n    import os, traceback\n    traceback.print_exc()\n    os._exit(97)\n")
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    return env


RANK_PRELOAD = ("torch", "torch._dynamo", "distributed", "train", "conftest")
"""What the server :func:`run_ranks` forks its ranks from has imported: a fresh interpreter spends about 3 s of CPU on
these (torch, and Dynamo, which the first optimizer imports) before a tiny job's first step."""


@functools.cache
def _rank_context():
    """The ``forkserver`` context of :func:`run_ranks`, its server (started on first use, with one OpenMP thread: torch
    reads ``OMP_NUM_THREADS`` when it is imported) having imported :data:`RANK_PRELOAD`."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(RANK_PRELOAD))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        multiprocessing.forkserver.ensure_running()
    return context


def _run_rank(script: str, argv: list, env: dict, cwd: str, log: str) -> None:
    """A rank of :func:`run_ranks`, forked: ``env`` as its whole environment, ``cwd``, its output to ``log``, then
    ``script`` run as ``__main__`` (its ``sys.exit`` code is the process's), as ``python script argv...`` would."""
    time.sleep(START_DELAY_S)  # a GPU host's slow start, where asked for
    multiprocessing.set_start_method(None, force=True)  # the interpreter's default (a forked child inherits its own)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    handle = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):
        os.dup2(handle, stream)
    os.close(handle)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def run_ranks(script: str, folder, nproc: int = 2, timeout: Optional[float] = None) -> list[str]:
    """Run ``script`` (Python source) as ``nproc`` gloo ranks on the CPU, each with ``RANK``/``WORLD_SIZE``/...
    set and ``tests/`` on ``PYTHONPATH``; ``sys.argv[1:]`` is ``folder`` and the tests folder. Returns each rank's
    output; fails the test when a rank fails. ``timeout``: seconds (default :func:`bound` of 120 s of work).

    Each rank is a process of its own, forked from a server that has imported :data:`RANK_PRELOAD` once
    (:func:`_rank_context`), which saves a tiny job most of its CPU; the tests of the launch itself start fresh
    interpreters (``multiproc.py``, :func:`start_job`)."""
    path = Path(folder) / "worker.py"
    path.write_text(script)
    port, procs, logs = free_port(), [], []
    for rank in range(nproc):
        env = clean_env(nproc, cpu_only=True, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), env["PYTHONPATH"]])
        logs.append(Path(folder) / f"rank{rank}.log")
        procs.append(_rank_context().Process(target=_run_rank, args=(
            str(path), [str(folder), os.path.join(ROOT, "tests")], env, os.getcwd(), str(logs[-1]))))
        procs[-1].start()
    deadline = time.monotonic() + (timeout or bound(120))
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    running = [proc.pid for proc in procs if proc.exitcode is None]
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    outputs = [log.read_text(errors="replace") if log.exists() else "" for log in logs]
    if running:
        shown = "\n".join(f"--- rank {rank} (pid {proc.pid}):\n{said[-3000:]}"
                           for rank, (proc, said) in enumerate(zip(procs, outputs)))
        pytest.fail(f"not finished after {timeout or bound(120):.0f} s; still running: {running}\n{shown}")
    assert all(proc.exitcode == 0 for proc in procs), outputs
    return outputs


def train_on_ranks(argv: list, folder, timeout: Optional[float] = None) -> list[str]:
    """``train.main(argv)`` on 2 gloo ranks started by hand (:func:`run_ranks`, no launcher: for tests that prove the
    training, not the launch), its worker script in ``folder`` (made here, absent before); each rank's output. Fails
    the test when a rank fails."""
    Path(folder).mkdir()
    return run_ranks(f"import sys\nimport train\nsys.exit(train.main({argv!r}))\n", folder, timeout=timeout)


def finish_all(procs: list, timeout: float) -> list[str]:
    """Each process's output once all have ended, within ``timeout`` seconds together. Past it, fails the test
    showing which were still running and what every one had printed, then kills those left (never left running)."""
    deadline, outputs = time.monotonic() + timeout, []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            running = [other.pid for other in procs if other.poll() is None]
            for other in procs:
                if other.poll() is None:
                    other.kill()
            outputs += [other.communicate()[0] for other in procs[len(outputs):]]
            shown = "\n".join(f"--- process {i} (pid {other.pid}):\n{(said or '')[-3000:]}"
                               for i, (other, said) in enumerate(zip(procs, outputs)))
            pytest.fail(f"not finished after {timeout:.0f} s; still running: {running}\n{shown}")
    return outputs


def perturbed_tiny_model(name: str):
    """``(model, cfg)``: model ``name`` in the tiny config, every weight moved off its initial value (a layer that
    starts at zero included): a stand-in for trained weights, for tests of weights in other formats. Mel statistics
    a run records where the config leaves them null (``mel_mean``, ``mel_std`` of its section) are set, as a log-mel's."""
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    section = getattr(cfg, name)
    if getattr(section, "mel_mean", 0.0) is None and getattr(section, "mel_std", 1.0) is None:
        section.mel_mean, section.mel_std = -6.0, 2.2
    torch.manual_seed(0)
    model = MODELS[name].build_model(cfg)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    return model, cfg


def old_weight_norm_names(key: str) -> str:
    """A key of a layer under ``torch.nn.utils.parametrizations.weight_norm`` as the old ``weight_norm`` names it
    (``weight_g``, ``weight_v``): the form of published checkpoints from before 2023."""
    return key.replace(".parametrizations.weight.original0", ".weight_g").replace(
        ".parametrizations.weight.original1", ".weight_v")


def train_from_and_infer(tmp_path, name: str, weights, infer_args: list) -> None:
    """``train.py --init-from weights`` for one tiny step of model ``name`` (in this process: :func:`run_train_main`),
    then ``inference.py``'s command line on the checkpoint it saved with ``infer_args`` (``--wav`` of the corpus when
    empty; in this process too: :func:`run_main`), as a user runs it; asserts both succeed and say so."""
    corpus, out = synth_corpus(tmp_path / "corpus", n=10), tmp_path / "out"
    said = train_in_process(["--config", "config.json", "--model", name, "--tiny", "--max-steps", "1", "--init-from",
                             str(weights), "--dataset-path", str(corpus), "--output-dir", str(out), "--set",
                             "data.num_workers=0"])
    assert f"initialised {name} from {weights}" in said, said[-3000:]
    args = infer_args or ["--wav", str(sorted((corpus / "wavs").glob("*.wav"))[0])]
    run_main("inference", "--checkpoint", str(out / "checkpoint_last.pt"), "--device", "cpu", "--output",
             str(tmp_path / "x.wav"), *args)  # fails the test unless it exits 0
    assert (tmp_path / "x.wav").is_file()


def run_train_main(argv: list) -> tuple[int, str, str]:
    """``train.main(argv)`` in this process, its signal handlers, TF32/cuDNN flags and intra-op thread count restored
    after; (exit code, stdout, stderr)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    backends = torch.backends
    flags = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = train.main(argv)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.benchmark = flags
        torch.set_num_threads(threads)
    return code, out.getvalue(), err.getvalue()


def train_in_process(argv: list) -> str:
    """:func:`run_train_main` for a run that must succeed: its stdout and stderr together, once it has exited 0 (the
    test fails with the end of its stderr otherwise)."""
    code, out, err = run_train_main(argv)
    assert code == 0, err[-4000:]
    return out + err


def write_checkpoints(out, steps, keep_last=0):
    """A model of TEST_MODEL (tiny config) and its optimizer saved at each of ``steps`` as sharded checkpoint folders
    (``ShardedCheckpointer`` in this one process, not train.py: any model, several optimizers too); returns the model.
    Only the tests of the sharding part call it (a project without it has no ``utils.checkpoint.sharded``)."""
    from utils.checkpoint.sharded import ShardedCheckpointer
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    torch.manual_seed(0)
    model = MODELS[TEST_MODEL].build_model(cfg)
    optimizer = torch.optim.Adam(model.parameters())
    checkpointer = ShardedCheckpointer(out, rank=0, keep_last=keep_last)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for step in steps:
        with torch.no_grad():
            next(model.parameters()).add_(1.0)  # every step's weights differ
        states = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
                  "position": TrainState(step=step), "rng": RngStates()}
        info = {"model_name": TEST_MODEL, "config": cfg.to_dict()}
        assert checkpointer.save(step, states, info) == out / f"checkpoint_{step}"
    return model


def run_main(*args, check=True) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` of the project's own command line (``inference``, ``scripts.consolidate_checkpoint``,
    ``scripts.import_weights``, ...), in this process (the module's ``main``): its exit status and output, as a
    subprocess would give them; with ``check``, the test fails unless it exited 0."""
    script, argv = args[0], list(args[1:])
    module = importlib.import_module(script)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = module.main(argv)
        except SystemExit as exit_:  # argparse's --help and usage errors
            code = exit_.code
    done = subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())
    if check:
        assert code == 0, done.stderr[-3000:]
    return done


MAINS_WITHIN = '''
import contextlib, importlib, io, json, resource, sys, traceback
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
said = []
for module, *argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        except Exception:  # noqa: BLE001 - the test reads it: a traceback is what it must not see
            code = None
            traceback.print_exc()
    said.append([code, err.getvalue()])
with open("/proc/self/status") as status:  # this process's own peak: VmHWM, kilobytes
    peak = int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024
print(json.dumps({"said": said, "peak": peak}))
'''


def mains_within(commands: list, limit: int = 2 << 30) -> tuple[list[tuple[Optional[int], str]], int]:
    """Each of ``commands`` (``[module, its arguments...]``: ``train``, ``inference``, ``scripts.NAME``) through the
    module's ``main``, one after the other in one fresh process whose address space is limited to ``limit`` bytes
    (``RLIMIT_AS``: an allocation past it fails in that process, never takes this machine's memory). Returns each
    one's ``(exit status, stderr)`` (``None`` and the traceback where it raised) and the process's peak resident
    bytes: Linux's ``VmHWM``, its own. (Not ``getrusage``'s ``ru_maxrss``: Linux carries it across ``exec``, so a
    process this one starts reports this process's peak if that is higher: a test process that once held 2 GB.)"""
    env = clean_env(1, cpu_only=True, MALLOC_ARENA_MAX="2")  # glibc's arenas reserve 64 MB of address space each
    done = subprocess.run([sys.executable, "-c", MAINS_WITHIN, str(limit), json.dumps(commands)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=bound(120, starts=1))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    return [tuple(said) for said in result["said"]], result["peak"]


def launch_command(path) -> list[str]:
    """The argv a launch file of ``scripts/`` starts on every node, read from the file itself.

    * Kubeflow TrainJob (``scripts/kubeflow/trainjob.yaml``): ``spec.trainer.command`` followed by its ``args``.
    * Kubeflow PyTorchJob (``scripts/kubeflow/pytorchjob.yaml``): the ``command`` and ``args`` of the Master's
      ``pytorch`` container.
    * SkyPilot task (``scripts/skypilot/train.yaml``): ``shlex.split`` of its ``run`` block, which must hold exactly
      one command (blank and comment lines aside).

    Skips the calling test without PyYAML (``pip install -r requirements-launch.txt``). Raises :class:`ValueError`
    for a file that is none of these, or a ``run`` block of several commands.
    """
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the launch files: pip install -r requirements-launch.txt")
    doc = yaml.safe_load(Path(path).read_text())
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "TrainJob":
        trainer = doc["spec"]["trainer"]
        return [*trainer.get("command", []), *trainer.get("args", [])]
    if kind == "PyTorchJob":
        pod = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        container = next(c for c in pod["containers"] if c["name"] == "pytorch")
        return [*container.get("command", []), *container.get("args", [])]
    if isinstance(doc, dict) and isinstance(doc.get("run"), str):
        lines = [line for line in doc["run"].splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if len(lines) != 1 or lines[0].rstrip().endswith("\\"):
            raise ValueError(f"{path}: the run block must be one command, found {len(lines)} line(s)")
        return shlex.split(lines[0])
    raise ValueError(f"{path}: not a TrainJob, a PyTorchJob or a SkyPilot task with a run block")


# --- reference parity: tests/data/reference holds what NVIDIA's and jik876's code computed (README.md there) ----------

REFERENCE = Path(ROOT) / "tests" / "data" / "reference"
PARITY_TOLERANCE = 1e-5
"""float32's: the same operations in the same order give the same bits (every difference measured is 0 but WaveGlow's
inverse, ~1e-6); 1e-5 leaves room for another BLAS's order, far below what a wrong layer, key or noise order gives."""


def reference_fixture(name: str) -> tuple[dict, dict]:
    """``(arrays, meta)`` of the fixture ``tests/data/reference/<name>`` (an ``.npz``; ``meta``: its JSON entry)."""
    with np.load(REFERENCE / name, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def formula_value(key: str, shape, dtype: str = "float32") -> torch.Tensor:
    """The value the fixtures gave the reference's parameter ``key`` (its ``state_dict`` name): from the key, the shape
    and the element index alone. ``r[i]``: splitmix64's finaliser of ``(crc32(key) << 32) + i``, to [-1, 1); then
    ``r * sqrt(3 / fan_in)``, except biases and running means ``0.1 r``, 1-D weights and ``weight_g`` ``1 + 0.1 r``,
    ``running_var`` ``1 + 0.25 r``, WaveGlow's ``convinv.<k>.conv.weight`` ``I + (0.5 / c) r``, its
    ``WN.<k>.end.weight`` a tenth of the rule, Tacotron2's ``gate_layer.linear_layer.bias`` ``-1 + 0.1 r``, integers
    0."""
    shape, parts = tuple(shape), key.split(".")
    if not getattr(torch, dtype).is_floating_point:
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    numel = int(np.prod(shape))
    x = (np.uint64(zlib.crc32(key.encode())) << np.uint64(32)) + np.arange(numel, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = (x ^ (x >> np.uint64(shift))) * np.uint64(factor)
        x ^= x >> np.uint64(31)
    r = ((x >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0).reshape(shape)
    scale = np.sqrt(3.0 * shape[0] / numel) if numel else 0.0
    if parts[-4:-3] == ["convinv"] and parts[-2:] == ["conv", "weight"]:
        value = np.eye(shape[0])[:, :, None] + 0.5 / shape[0] * r
    elif parts[-4:-3] == ["WN"] and parts[-2:] == ["end", "weight"]:
        value = 0.1 * r * scale
    elif key.endswith("gate_layer.linear_layer.bias"):
        value = 0.1 * r - 1.0
    elif key.endswith("running_var"):
        value = 1.0 + 0.25 * r
    elif key.endswith("weight_g") or (len(shape) == 1 and key.endswith("weight")):
        value = 1.0 + 0.1 * r
    else:
        value = 0.1 * r if len(shape) == 1 else r * scale
    return torch.from_numpy(np.ascontiguousarray(value)).to(getattr(torch, dtype))


def formula_state(meta: dict) -> dict[str, torch.Tensor]:
    """The reference's whole ``state_dict`` of a fixture (its ``meta["keys"]``: ``[key, shape, dtype]``), by
    :func:`formula_value`."""
    return {key: formula_value(key, shape, dtype) for key, shape, dtype in meta["keys"]}


def mel_input(frames: int, channels: int = 80) -> torch.Tensor:
    """The fixtures' mel ``(1, channels, frames)``: ``-5 + 3 sin(0.21 c + 0.9 t + 0.5) cos(0.05 c (t + 1))``."""
    c, t = np.arange(channels)[:, None], np.arange(frames)[None, :]
    return torch.from_numpy((-5 + 3 * np.sin(0.21 * c + 0.9 * t + 0.5) * np.cos(0.05 * c * (t + 1)))
                            .astype(np.float32))[None]


def audio_input(samples: int) -> torch.Tensor:
    """The fixtures' audio ``(1, samples)``: ``0.5 sin(2 pi 220 n / 22050) + 0.2 sin(2 pi 1000 n / 22050 + 1)``."""
    n = np.arange(samples)
    return torch.from_numpy((0.5 * np.sin(2 * np.pi * 220 * n / 22050) + 0.2 * np.sin(2 * np.pi * 1000 * n / 22050 + 1))
                            .astype(np.float32))[None]


def reference_config(**sections):
    """The project's full-size config with ``sections`` (``{section: {key: value}}``) set as ``--set`` would."""
    overrides = [f"{section}.{key}={json.dumps(value)}" for section, values in sections.items()
                 for key, value in values.items()]
    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), overrides=overrides)


def as_records(state: dict):
    """A flat ``state_dict`` as the tree of ``utils.checkpoint.published.Record`` s a pickled module becomes (NVIDIA's
    WaveGlow file)."""
    from utils.checkpoint.published import Record  # an after-training tool: the parity tests go with it

    root = Record()
    for key, value in state.items():
        *path, name = key.split(".")
        node = root
        for part in path:
            node = vars(node).setdefault("_modules", {}).setdefault(part, Record())
        vars(node).setdefault("_parameters", {})[name] = value
    return root


def reference_model(name: str, cfg, weights):
    """Model ``name`` of ``cfg`` holding ``weights`` (a ``Published.read`` result), in eval mode."""
    model = MODELS[name].build_model(cfg)
    load_into(model, weights, "the reference's weights")
    return model.eval()


def assert_close(ours: torch.Tensor, reference: np.ndarray, what: str, tolerance: float = PARITY_TOLERANCE) -> None:
    """``ours`` has the reference's shape and differs from it by at most ``tolerance`` anywhere."""
    ours = ours.detach().numpy()
    assert ours.shape == reference.shape, f"{what}: shape {ours.shape} vs the reference's {reference.shape}"
    difference = float(np.abs(ours - reference).max())
    assert difference <= tolerance, f"{what}: max abs difference {difference:.3g} > {tolerance:g}"


def import_published(tmp_path, weights, sets: dict) -> tuple[dict, str]:
    """``python -m scripts.import_weights weights`` (in this process) with ``--set section.key=value`` for ``sets``:
    (the checkpoint written, the line it printed)."""
    from scripts import import_weights  # an after-training tool: the parity tests go with it

    args = [str(weights), "--output", str(tmp_path / "imported.pt"), "--force"]
    for section, values in sets.items():
        args += [item for key, value in values.items() for item in ("--set", f"{section}.{key}={json.dumps(value)}")]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = import_weights.main(args)
    assert code == 0, err.getvalue()
    return torch.load(tmp_path / "imported.pt", weights_only=True), out.getvalue()


def check_recipe(name: str, framing: str, clip: float, tune: bool, optimizer: tuple[float, float],
                 batching: Optional[dict] = None, ema: float = 0.0) -> None:
    """The settings config.json leaves null take model ``name``'s recipe (its mel framing, gradient clipping, cuDNN's
    autotuner, ``optimizer``: its learning rate and weight decay; ``batching``: its ``data`` keys, where it names them;
    ``ema``: its EMA's decay, the project's 0 where the recipe names none), checkpoints record them, and given values
    keep their meaning (the tiny block's learning rate too)."""
    assert MODELS[name].recipe == {"audio.mel_framing": framing, "train.grad_clip": clip, "train.cudnn_benchmark": tune,
                                   "optimizer.lr": optimizer[0], "optimizer.weight_decay": optimizer[1],
                                   **(batching or {}), **({"train.ema_decay": ema} if ema else {})}
    with open(f"{ROOT}/config.json") as file:
        raw = json.load(file)
    assert raw["audio"]["mel_framing"] is raw["train"]["grad_clip"] is raw["train"]["cudnn_benchmark"] is None
    assert raw["optimizer"]["lr"] is raw["optimizer"]["weight_decay"] is raw["train"]["ema_decay"] is None
    cfg = train.load_run_config(train.parse_args(["--config", f"{ROOT}/config.json", "--model", name, "--tiny"]))
    assert (cfg.audio.mel_framing, cfg.train.grad_clip, cfg.train.cudnn_benchmark) == (framing, clip, tune)
    assert cfg.train.ema_decay == ema
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay) == (raw["tiny"]["optimizer"]["lr"], optimizer[1])
    saved = cfg.to_dict()  # what a checkpoint records
    assert (saved["audio"]["mel_framing"], saved["train"]["grad_clip"], saved["train"]["cudnn_benchmark"]) == (
        framing, clip, tune)
    other = {"nvidia": "jik876", "jik876": "nvidia"}[framing]
    cfg = train.load_run_config(train.parse_args(["--config", f"{ROOT}/config.json", "--model", name, "--set",
                                                  f"audio.mel_framing={other}", "--set", "train.grad_clip=0",
                                                  "--set", "train.ema_decay=0"]))
    assert (cfg.audio.mel_framing, cfg.train.grad_clip, cfg.train.ema_decay) == (other, 0.0, 0.0)  # as given
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay) == optimizer


RECORDED_RANK = """
import json, os, signal, sys
import train
read, seen = train.next_micro_batches, []

def reading(*args, **kwargs):  # the utterance ids of every step, as the loop receives them
    micro = read(*args, **kwargs)
    seen.append(micro[2])
    if len(seen) == STOP_AT and os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGTERM)  # inside step STOP_AT: the run stops after it, on every rank
    return micro

train.next_micro_batches = reading
code = train.main(ARGV)
with open(os.path.join(sys.argv[1], "ids" + os.environ["RANK"] + ".json"), "w") as file:
    json.dump(seen, file)
sys.exit(code)
"""
"""A rank's script for :func:`run_ranks` (``STOP_AT = N`` and ``ARGV = [...]`` put in front): ``train.main(ARGV)``,
recording the utterance ids of every step it trains in ``ids<RANK>.json`` in the folder given as its first argument;
rank 0 sends itself SIGTERM while it reads step ``STOP_AT`` (0: never), so the run stops after that step."""


def recorded_steps(argv: list, folder, stop_at: int = 0) -> tuple[str, list[list[str]]]:
    """``train.main(argv)`` on 2 gloo ranks (:func:`run_ranks` of :data:`RECORDED_RANK`, its script in ``folder``, made
    here, absent before), rank 0 sending itself SIGTERM inside step ``stop_at`` (0: never): rank 0's output and the
    utterance ids of each step it trained, both ranks' together. Fails the test when a rank fails."""
    Path(folder).mkdir()
    said = run_ranks(f"STOP_AT = {stop_at}\nARGV = {argv!r}\n{RECORDED_RANK}", folder, timeout=bound(300))[0]
    ranks = [json.loads((Path(folder) / f"ids{rank}.json").read_text()) for rank in (0, 1)]
    return said, [step0 + step1 for step0, step1 in zip(*ranks)]


def metrics_rows(out) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` (one a logged step) in output folder ``out``."""
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def assert_same_weights(runs: list) -> None:
    """The ``checkpoint_last.pt`` of each output folder of ``runs`` holds the same weights, bit for bit: its model's
    and, where the run keeps one, its EMA's (``train.ema_decay``)."""
    saved = [torch.load(Path(out) / "checkpoint_last.pt", map_location="cpu", weights_only=True) for out in runs]
    for entry in ("model", "ema"):
        first = saved[0].get(entry) or {}
        for other in saved[1:]:
            assert (other.get(entry) or {}).keys() == first.keys(), entry
            assert all(torch.equal(first[key], other[entry][key]) for key in first), entry


def frame_budgets_resume_through_2_1_2(tmp_path, monkeypatch, common: list, utterances: list, last: int = 6) -> None:
    """The resumes of a run of frame budgets (``common``: train.py's arguments less ``--output-dir`` and
    ``--max-steps``; ``utterances``: the training split's ids, its first epoch 4 to ``last - 1`` steps on 2 processes),
    on 2 gloo ranks (:func:`recorded_steps`) in folders of ``tmp_path``:

    * 4 steps; the same stopped by SIGTERM inside step 2, then resumed on 2 processes: the same utterances at each
      step, the same losses (each of a model's several too) and the same weights (:func:`assert_same_weights`).
    * the stopped run resumed on 1 process in this one for a step (2 micro-batches; the loop's reads recorded by
      ``monkeypatch``-ing ``train.next_micro_batches``), then on 2 again to step ``last`` (in the second epoch): the
      first epoch reads each of ``utterances`` once, and each resume on another number of processes says the rest
      of its epoch was planned afresh."""
    def run(out, steps, stop_at=0):
        return recorded_steps([*common, "--output-dir", str(out), "--max-steps", str(steps)],
                              tmp_path / f"{out.name}_{steps}_ranks", stop_at)

    def losses(out):
        return [(row["loss"], row.get("losses")) for row in metrics_rows(out)]

    _, whole_ids = run(tmp_path / "whole", 4)
    said, stopped_ids = run(tmp_path / "stopped", 4, stop_at=2)
    assert "stopped at step 2 on SIGTERM" in said and stopped_ids == whole_ids[:2], said[-2000:]
    shutil.copytree(tmp_path / "stopped", tmp_path / "resumed", symlinks=True)
    assert run(tmp_path / "resumed", 4)[1] == whole_ids[2:]
    assert losses(tmp_path / "resumed") == losses(tmp_path / "whole")
    assert_same_weights([tmp_path / "whole", tmp_path / "resumed"])

    one, one_ids, read = tmp_path / "one", [], train.next_micro_batches
    shutil.copytree(tmp_path / "stopped", one, symlinks=True)

    def reading(*args):
        micro = read(*args)
        one_ids.append(micro[2])
        return micro
    monkeypatch.setattr(train, "next_micro_batches", reading)
    said = train_in_process([*common, "--output-dir", str(one), "--max-steps", "3", "--set", "data.num_workers=0"])
    assert "written by 2 process(es), this run has 1" in said and "planned afresh for 1" in said, said[-2000:]
    said, two_ids = run(one, last)
    assert "planned afresh for 2" in said, said[-2000:]
    epochs = [row["epoch"] for row in metrics_rows(one)]
    assert epochs[:3] == [0, 0, 0] and epochs[-1] == 1, epochs  # the last step reads the next epoch
    first_epoch = [i for step in stopped_ids[:2] + one_ids + two_ids[:epochs.count(0) - 3] for i in step]
    assert sorted(first_epoch) == sorted(utterances)


VOICE_LAYOUTS = [name for name in corpora.readers(DataSettings()) if name != "ljspeech"]
"""The layouts of several speakers this project reads (its parts' and filelists), in the order ``auto`` tries them:
the four-voice tests train on a demo corpus in each."""
FOUR_VOICES = {"vctk": ["p225", "p226", "p227", "p228"], "libritts": ["19", "26", "27", "32"]}
"""The speakers of a 4-voice demo corpus (``scripts.make_demo_corpus --speakers 4``) in each layout: VCTK's names,
elsewhere LibriVox reader ids (sorted as strings)."""


def four_voice_argv(name: str, corpus, out, layout: str) -> list[str]:
    """train.py's arguments for 1 tiny step of model ``name`` on ``corpus``, a 4-voice demo corpus in ``layout``
    (:func:`demo_corpus`), read by ``data.format=auto`` (a filelist's lists named), into ``out``; no data workers, no
    trackers (no validation pictures nor audio) where the project has the key (the experiment trackers' part)."""
    argv = ["--config", os.path.join(ROOT, "config.json"), "--model", name, "--tiny", "--dataset-path", str(corpus),
            "--max-steps", "1", "--output-dir", str(out), "--set", "data.num_workers=0"]
    if "train.trackers" not in {key for keys in LEFT_OUT.values() for key in keys}:
        argv += ["--set", "train.trackers=[]"]
    if layout == "filelist":
        argv += ["--set", "data.training_files=filelists/train.txt", "--set", "data.validation_files=filelists/val.txt"]
    return argv


def assert_four_voices(name: str, layout: str, out, said: str) -> list[str]:
    """A run of model ``name`` into ``out`` on a 4-voice demo corpus in ``layout`` found the layout (its output
    ``said``), and its ``speakers.json`` and checkpoint hold the 4 voices sorted, its model a 4-row speaker table
    (``Training.speaker_rows``); returns the voices in their order."""
    assert f"data.format=auto: found the {layout} layout" in said, said[-3000:]
    voices = FOUR_VOICES.get(layout, FOUR_VOICES["libritts"])
    assert json.loads((Path(out) / "speakers.json").read_text()) == {voice: i for i, voice in enumerate(voices)}
    saved = torch.load(Path(out) / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["speakers"] == {voice: i for i, voice in enumerate(voices)}
    assert [saved["model"][key].shape[0] for key in MODELS[name].training.speaker_rows] == [4], saved["model"].keys()
    return voices


def assert_speaks_each_voice(checkpoint, voices: list, folder, *options: str) -> None:
    """``inference.py --checkpoint checkpoint --speaker VOICE OPTIONS`` (in this process, :func:`run_main`;
    ``options``: what to speak and how) for each of ``voices``, each wav written in ``folder``: every voice's audio
    differs from the others'."""
    spoken = []
    for voice in voices:
        wav = Path(folder) / f"{voice}.wav"
        run_main("inference", "--checkpoint", str(checkpoint), "--output", str(wav), "--speaker", voice, "--device",
                 "cpu", *options)
        spoken.append(sf.read(wav)[0].tobytes())
    assert len(set(spoken)) == len(voices), "two voices gave the same audio"
