"""The launch files of ``scripts/kubeflow/`` and ``scripts/skypilot/``, checked with the platforms' own clients and
against the project. Fast: nothing is trained and no cluster is needed.

* ``trainjob.yaml`` (Kubeflow Trainer v2): every key is walked against the pydantic models of
  ``kubeflow_trainer_api`` from ``TrainerV1alpha1TrainJob`` down (a key must be the wire name of a field there, and
  a leaf must pass the field's own strict type), then ``TrainerV1alpha1TrainJob.from_dict`` must accept it and give
  the same document back. ``from_dict`` alone ignores unknown keys: a misspelled field would vanish unseen.
* ``pytorchjob.yaml`` (Training Operator v1): the same walk over the openapi models of ``kubeflow.training`` and
  the Kubernetes client (keys from ``attribute_map``, types from ``openapi_types``); every model is built, which
  checks its required fields, and serialises back to the same document.
* ``skypilot/train.yaml``: ``sky.Task.from_yaml``, which checks the task against SkyPilot's schema and refuses
  unknown keys, and the checks SkyPilot runs on the local side before a launch (name, run, workdir, file mounts).
* Each validation refuses a document with one misspelled key, naming the key (and a value of the wrong type).
* What a user relies on: each file runs ``python multiproc.py ... train.py --config config.json`` with no topology
  option (the platform gives it), a grace period longer than ``--stop-timeout``, the output folder on a persistent
  volume (or bucket) every node sees, shared memory in RAM, the project's image, and no ``PET_*`` variable of its
  own.

Without the clients these tests are skipped: ``pip install -r requirements-launch.txt``.
"""

import copy
import datetime
import re
import shlex
import typing
from pathlib import Path, PurePosixPath

import pytest
from conftest import launch_command
from pydantic import BaseModel, TypeAdapter, ValidationError

PROJECT = Path(__file__).resolve().parents[1]
SLUG = PROJECT.name
TRAINJOB = PROJECT / "scripts" / "kubeflow" / "trainjob.yaml"
PYTORCHJOB = PROJECT / "scripts" / "kubeflow" / "pytorchjob.yaml"
SKYPILOT = PROJECT / "scripts" / "skypilot" / "train.yaml"
LAUNCH_FILES = [TRAINJOB, PYTORCHJOB, SKYPILOT]
INSTALL = "pip install -r requirements-launch.txt"

TOPOLOGY_OPTIONS = {"--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr", "--master-port",
                    "--master_port", "--nproc-per-node", "--nproc_per_node", "--standalone"}
"""multiproc.py's options that the platform's variables give: a launch file that sets them runs every node alike."""

PLATFORM_VARIABLES = re.compile(r"^(PET_|SKYPILOT_)|^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK)$")
"""Variables the platforms set for each node; set by hand they would be the same on every node, or refused."""

TRAINER_NODE = "node"
"""The replicated job and the trainer container of Kubeflow's ``torch-distributed`` runtime (kubeflow/trainer:
``manifests/base/runtimes/torch_distributed.yaml``; ``constants.Node`` in ``pkg/constants/constants.go``)."""


def need(module: str):
    """``module`` imported, or the test skipped naming the requirements file."""
    return pytest.importorskip(module, reason=f"{module} is not installed: {INSTALL}")


def load(path: Path) -> dict:
    """A launch file's YAML document."""
    yaml = need("yaml")
    return yaml.safe_load(path.read_text())


# ------------------------------------------------------------------------------------- pydantic walk (Trainer v2)


def _strip_optional(annotation):
    """``annotation`` without ``None`` in a union (``Optional[X]`` -> ``X``)."""
    if typing.get_origin(annotation) is typing.Union:
        kept = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return kept[0] if len(kept) == 1 else typing.Union[tuple(kept)]
    return annotation


def _field_annotation(field):
    """A pydantic field's type with its constraints: a ``StrictStr`` field keeps ``Strict`` in ``field.metadata``."""
    return typing.Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


def walk_pydantic(value, annotation, path: str, problems: list) -> None:
    """Check ``value`` against a pydantic type from ``kubeflow_trainer_api.models``, appending one line per problem.

    A model takes a mapping whose keys are its fields' wire names (the alias where there is one) and which has
    every required field; lists, dicts, ``Optional`` and ``Annotated`` are followed down to the models inside;
    a oneOf wrapper (``Quantity``, ``IntOrString``) is parsed with its own ``from_dict``; any other leaf is
    validated strictly by the field's type (``StrictInt``, ``StrictStr``...).
    """
    annotation = _strip_optional(annotation)
    if value is None:
        problems.append(f"{path}: null")
        return
    inner = annotation
    if typing.get_origin(inner) is typing.Annotated:
        inner = _strip_optional(typing.get_args(inner)[0])
    origin = typing.get_origin(inner)
    if origin in (list, typing.List):
        _walk_pydantic_list(value, typing.get_args(inner)[0], path, problems)
    elif origin in (dict, typing.Dict):
        _walk_pydantic_dict(value, typing.get_args(inner)[1], path, problems)
    elif isinstance(inner, type) and issubclass(inner, BaseModel):
        _walk_pydantic_model(value, inner, path, problems)
    else:
        try:
            TypeAdapter(annotation).validate_python(value, strict=True)
        except ValidationError as err:
            problems.append(f"{path}: {value!r} refused: {err.errors()[0]['msg']}")


def _walk_pydantic_list(value, item_type, path: str, problems: list) -> None:
    """:func:`walk_pydantic` of a ``list[item_type]``."""
    if not isinstance(value, list):
        problems.append(f"{path}: a list is expected, not {type(value).__name__}")
        return
    for i, item in enumerate(value):
        walk_pydantic(item, item_type, f"{path}[{i}]", problems)


def _walk_pydantic_dict(value, item_type, path: str, problems: list) -> None:
    """:func:`walk_pydantic` of a ``dict[str, item_type]``."""
    if not isinstance(value, dict):
        problems.append(f"{path}: a mapping is expected, not {type(value).__name__}")
        return
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{path}: key {key!r} is not a string")
        walk_pydantic(item, item_type, f"{path}.{key}", problems)


def _walk_pydantic_model(value, model: type, path: str, problems: list) -> None:
    """:func:`walk_pydantic` of a pydantic model: a oneOf wrapper parsed by its ``from_dict``, else a mapping of its
    fields' wire names holding every required one."""
    if "actual_instance" in model.model_fields:  # oneOf: a scalar of one of several types
        try:
            model.from_dict(value)
        except (ValueError, ValidationError) as err:
            problems.append(f"{path}: {value!r} is not a {model.__name__}: {str(err).splitlines()[0]}")
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: a {model.__name__} mapping is expected, not {type(value).__name__}")
        return
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}: not a field of {model.__name__} (its fields: {', '.join(fields)})")
        else:
            walk_pydantic(item, _field_annotation(fields[key]), f"{path}.{key}", problems)
    for key, field in fields.items():
        if field.is_required() and key not in value:
            problems.append(f"{path}.{key}: required by {model.__name__}, missing")


def trainjob_problems(doc) -> list:
    """Every problem of a TrainJob document by :func:`walk_pydantic`, from ``TrainerV1alpha1TrainJob``."""
    models = need("kubeflow_trainer_api.models")
    problems: list = []
    walk_pydantic(doc, models.TrainerV1alpha1TrainJob, "TrainJob", problems)
    return problems


# ------------------------------------------------------------------------------- openapi walk (PyTorchJob v1)

OPENAPI_LIST = re.compile(r"^list\[(.+)\]$")
OPENAPI_DICT = re.compile(r"^dict\(([^,]+), (.+)\)$")


def _openapi_class(name: str):
    """The model class an openapi type string names: Kubeflow's first, then the Kubernetes client's."""
    training = need("kubeflow.training.models")
    client = need("kubernetes.client.models")
    for module in (training, client):
        if hasattr(module, name):
            return getattr(module, name)
    return None


def _scalar_ok(value, kind: str) -> bool:
    """Whether ``value`` (as YAML loads it) is a valid JSON value of the openapi scalar ``kind``."""
    if isinstance(value, bool):
        return kind in ("bool", "object")
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float))
    if kind == "bool":
        return False
    if kind in ("datetime", "date"):
        return isinstance(value, (str, datetime.date))
    if kind == "Quantity":  # a resource quantity: "16Gi", "8" or a plain number
        return isinstance(value, (str, int, float))
    if kind == "object":  # in a pod template these are IntOrString fields (ports): a number or a name
        return isinstance(value, (str, int))
    raise AssertionError(f"openapi type {kind!r} not handled by this test")


QUANTITY_FIELDS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
                   ("V1VolumeResourceRequirements", "limits"), ("V1VolumeResourceRequirements", "requests"),
                   ("V1EmptyDirVolumeSource", "size_limit"), ("V1PodSpec", "overhead")}
"""Fields of a pod template that Kubernetes types as a resource quantity and its Python client as ``str``: the API
server also takes a number there (``nvidia.com/gpu: 8``), so they are checked as quantities."""


def walk_openapi(value, type_name: str, path: str, problems: list):
    """Check ``value`` against an openapi type string of the generated clients (``'list[V1Container]'``,
    ``'dict(str, str)'``, ``'V1ObjectMeta'``, ``'int'``...), appending one line per problem; returns the value
    built as those models (``None`` where it could not be).

    A model takes a mapping whose keys are values of its ``attribute_map``; it is then built, so its own
    checks run (a required field missing raises ``ValueError`` in the generated setters).
    """
    if value is None:
        problems.append(f"{path}: null")
        return None
    listed, mapped = OPENAPI_LIST.match(type_name), OPENAPI_DICT.match(type_name)
    if listed:
        if not isinstance(value, list):
            problems.append(f"{path}: a list is expected ({type_name}), not {type(value).__name__}")
            return None
        return [walk_openapi(item, listed.group(1), f"{path}[{i}]", problems) for i, item in enumerate(value)]
    if mapped:
        return _walk_openapi_dict(value, type_name, mapped.group(1), mapped.group(2), path, problems)
    cls = _openapi_class(type_name)
    if cls is None:
        if not _scalar_ok(value, type_name):
            problems.append(f"{path}: {value!r} is not of type {type_name}")
        return value
    return _walk_openapi_model(value, cls, type_name, path, problems)


def _walk_openapi_dict(value, type_name: str, key_kind: str, item_type: str, path: str, problems: list):
    """:func:`walk_openapi` of a ``dict(key_kind, item_type)``: the mapping built, or ``None``."""
    if not isinstance(value, dict):
        problems.append(f"{path}: a mapping is expected ({type_name}), not {type(value).__name__}")
        return None
    built = {}
    for key, item in value.items():
        if not _scalar_ok(key, key_kind):
            problems.append(f"{path}: key {key!r} is not a {key_kind}")
        built[key] = walk_openapi(item, item_type, f"{path}.{key}", problems)
    return built


def _walk_openapi_model(value, cls: type, type_name: str, path: str, problems: list):
    """:func:`walk_openapi` of a generated model class: built from the mapping's fields, or ``None``."""
    if not isinstance(value, dict):
        problems.append(f"{path}: a {type_name} mapping is expected, not {type(value).__name__}")
        return None
    attribute_of = {wire: attribute for attribute, wire in cls.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        if key not in attribute_of:
            problems.append(f"{path}.{key}: not a field of {type_name} (its fields: {', '.join(attribute_of)})")
            continue
        attribute = attribute_of[key]
        kind = cls.openapi_types[attribute]
        if (type_name, attribute) in QUANTITY_FIELDS:
            kind = kind.replace("str)", "Quantity)") if kind.startswith("dict(") else "Quantity"
        kwargs[attribute] = walk_openapi(item, kind, f"{path}.{key}", problems)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        problems.append(f"{path}: {type_name} refused: {err}")
        return None


def pytorchjob_problems(doc) -> tuple[list, object]:
    """``(problems, the built KubeflowOrgV1PyTorchJob)`` of a PyTorchJob document by :func:`walk_openapi`."""
    problems: list = []
    built = walk_openapi(doc, "KubeflowOrgV1PyTorchJob", "PyTorchJob", problems)
    return problems, built


# ------------------------------------------------------------------------------- helpers for the project checks


def stop_timeout(argv: list) -> float:
    """multiproc.py's ``--stop-timeout`` in ``argv`` (its options come before the training script)."""
    own = argv[:argv.index("train.py")]
    for i, arg in enumerate(own):
        if arg == "--stop-timeout":
            return float(own[i + 1])
        if arg.startswith("--stop-timeout="):
            return float(arg.split("=", 1)[1])
    pytest.fail(f"no --stop-timeout before train.py in {argv}: the default may not fit the grace period")


def option(argv: list, name: str) -> str:
    """The value of ``name`` (``--output-dir``) after ``train.py`` in ``argv``."""
    script = argv[argv.index("train.py") + 1:]
    for i, arg in enumerate(script):
        if arg == name:
            return script[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    pytest.fail(f"no {name} for train.py in {argv}")


def kubernetes_pods(path: Path) -> list:
    """``[(where, pod spec, the training container), ...]`` of a Kubernetes launch file: the TrainJob's patch of
    the runtime's ``node`` job (its ``node`` container patch), or each replica of the PyTorchJob (its ``pytorch``
    container)."""
    doc = load(path)
    if doc["kind"] == "TrainJob":
        pods = []
        for p, patch in enumerate(doc["spec"].get("runtimePatches", [])):
            jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
            for j, job in enumerate(jobs):
                pod = job["template"]["spec"]["template"]["spec"]
                container = next((c for c in pod.get("containers", []) if c["name"] == TRAINER_NODE), None)
                pods.append((f"runtimePatches[{p}].replicatedJobs[{j}] ({job['name']})", pod, container))
        return pods
    return [(role, spec["template"]["spec"], next((c for c in spec["template"]["spec"]["containers"]
                                                   if c["name"] == "pytorch"), None))
            for role, spec in doc["spec"]["pytorchReplicaSpecs"].items()]


def mounted_volume(pod: dict, container: dict, path: str):
    """``(volume mount, volume)`` of ``container`` whose mount holds ``path`` (the deepest), or ``(None, None)``."""
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    holding = [mount for mount in container.get("volumeMounts", [])
               if PurePosixPath(path).is_relative_to(mount["mountPath"])]
    if not holding:
        return None, None
    mount = max(holding, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    return mount, volumes.get(mount["name"])


def env_names(node) -> list:
    """Names of every environment variable a document sets: ``env`` lists of Kubernetes containers (and of a
    TrainJob's ``trainer``), anywhere in it, and a SkyPilot task's ``envs``."""
    found = []
    if isinstance(node, dict):
        for key, item in node.items():
            if key == "env" and isinstance(item, list):
                found += [entry.get("name") for entry in item if isinstance(entry, dict)]
            elif key == "envs" and isinstance(item, dict):
                found += list(item)
            found += env_names(item)
    elif isinstance(node, list):
        for item in node:
            found += env_names(item)
    return found


# ------------------------------------------------------------------------------------------ the TrainJob


def test_trainjob_matches_the_trainer_v2_models_key_by_key_and_type_by_type():
    models = need("kubeflow_trainer_api.models")
    doc = load(TRAINJOB)
    problems = trainjob_problems(doc)
    assert not problems, "the TrainJob does not match kubeflow-trainer-api's models:\n" + "\n".join(problems)
    job = models.TrainerV1alpha1TrainJob.from_dict(doc)
    assert job.to_dict() == doc, "the models dropped or changed part of the TrainJob"
    assert (doc["apiVersion"], doc["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job.spec.runtime_ref.name == "torch-distributed"


@pytest.mark.parametrize("mutate, named", [
    (lambda pod, trainer: pod.__setitem__("terminationGracePeriodSecond", pod.pop("terminationGracePeriodSeconds")),
     "template.spec.terminationGracePeriodSecond: not a field of TrainerV1alpha1PodSpecPatch"),
    (lambda pod, trainer: trainer.__setitem__("numNodes", "2"), "trainer.numNodes: '2' refused"),
], ids=["misspelled key", "string for an integer"])
def test_trainjob_walk_refuses_a_misspelled_key_or_a_wrong_type_naming_its_path(mutate, named):
    need("kubeflow_trainer_api.models")
    doc = copy.deepcopy(load(TRAINJOB))
    patch = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    mutate(patch["template"]["spec"]["template"]["spec"], doc["spec"]["trainer"])
    problems = trainjob_problems(doc)
    assert len(problems) == 1 and named in problems[0], problems


def test_trainjob_patches_the_torch_distributed_runtimes_node_job_and_container():
    for where, pod, container in kubernetes_pods(TRAINJOB):
        assert where.endswith(f"({TRAINER_NODE})"), f"{where}: the torch-distributed runtime has one job, 'node'"
        assert container is not None, f"{where}: no patch of the runtime's trainer container '{TRAINER_NODE}'"


# ---------------------------------------------------------------------------------------- the PyTorchJob


def test_pytorchjob_matches_the_training_operator_and_kubernetes_models_key_by_key_and_type_by_type():
    client = need("kubernetes.client")
    need("kubeflow.training.models")
    doc = load(PYTORCHJOB)
    problems, built = pytorchjob_problems(doc)
    assert not problems, "the PyTorchJob does not match the openapi models:\n" + "\n".join(problems)
    assert client.ApiClient().sanitize_for_serialization(built) == doc, "the models dropped part of the PyTorchJob"
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1, replicas.keys()
    assert "backoffLimit" in doc["spec"]["runPolicy"]


@pytest.mark.parametrize("mutate, named", [
    (lambda pod: pod.__setitem__("terminationGracePeriodSecond", pod.pop("terminationGracePeriodSeconds")),
     "template.spec.terminationGracePeriodSecond: not a field of V1PodSpec"),
    (lambda pod: pod.__setitem__("terminationGracePeriodSeconds", "60"),
     "template.spec.terminationGracePeriodSeconds: '60' is not of type int"),
], ids=["misspelled key", "string for an integer"])
def test_pytorchjob_walk_refuses_a_misspelled_key_or_a_wrong_type_naming_its_path(mutate, named):
    need("kubeflow.training.models")
    doc = load(PYTORCHJOB)
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    replicas["Worker"]["template"] = copy.deepcopy(replicas["Worker"]["template"])  # not the Master's (a YAML alias)
    mutate(replicas["Worker"]["template"]["spec"])
    problems, _ = pytorchjob_problems(doc)
    assert len(problems) == 1 and "PyTorchJob.spec.pytorchReplicaSpecs.Worker." + named in problems[0], problems


def test_pytorchjob_master_and_worker_run_the_same_pytorch_container():
    pods = kubernetes_pods(PYTORCHJOB)
    for role, _, container in pods:
        assert container is not None, f"{role}: the operator needs a container named 'pytorch'"
    assert pods[0][1] == pods[1][1], "Master and Worker pods differ: every node must run the same command"


# -------------------------------------------------------------------------------------------- SkyPilot


def test_skypilot_task_loads_with_skypilots_own_loader_and_local_checks(monkeypatch):
    sky = need("sky")
    monkeypatch.chdir(PROJECT)  # `sky launch` runs from the project root: workdir `.` is the project
    task = sky.Task.from_yaml(str(SKYPILOT))
    task.validate_name()
    task.validate_run()
    task.expand_and_validate_workdir()
    task.expand_and_validate_file_mounts()
    assert task.num_nodes == 2
    assert Path(task.workdir) == PROJECT
    assert shlex.split(task.run) == launch_command(SKYPILOT)
    assert [r.accelerators for r in task.resources] == [{"H100": 8}]


def test_skypilot_loader_refuses_a_misspelled_key_naming_it(tmp_path):
    sky = need("sky")
    text = SKYPILOT.read_text()
    assert "\nnum_nodes:" in text
    broken = tmp_path / "train.yaml"
    broken.write_text(text.replace("\nnum_nodes:", "\nnum_node:"))
    with pytest.raises(Exception, match="num_node") as refused:
        sky.Task.from_yaml(str(broken))
    assert "num_nodes" in str(refused.value), "SkyPilot suggests the key it knows"


# --------------------------------------------------------------------------------- what a user relies on


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.relative_to(PROJECT).as_posix())
def test_launch_file_runs_multiproc_and_train_py_of_this_project_without_topology_options(path):
    argv = launch_command(path)
    assert argv[:2] == ["python", "multiproc.py"], argv
    assert "train.py" in argv, argv
    after = argv[argv.index("train.py") + 1:]
    assert after[:2] == ["--config", "config.json"], argv
    for name in ("multiproc.py", "train.py", "config.json"):
        assert (PROJECT / name).is_file(), f"{name} is not in the project root"
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    assert not given & TOPOLOGY_OPTIONS, f"the platform gives these, not the file: {sorted(given & TOPOLOGY_OPTIONS)}"
    assert stop_timeout(argv) > 0
    assert PurePosixPath(option(argv, "--output-dir")).is_absolute()


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.relative_to(PROJECT).as_posix())
def test_launch_file_sets_no_variable_the_platform_gives_each_node(path):
    names = env_names(load(path))
    assert not [name for name in names if PLATFORM_VARIABLES.search(name or "")], names


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_grace_period_exceeds_multiprocs_stop_timeout(path):
    timeout = stop_timeout(launch_command(path))
    pods = kubernetes_pods(path)
    assert pods, f"{path.name}: no pod spec"
    for where, pod, _ in pods:
        grace = pod.get("terminationGracePeriodSeconds")
        assert grace is not None, f"{where}: Kubernetes' default 30 s is shorter than --stop-timeout {timeout:g}"
        assert timeout < grace, f"{where}: terminationGracePeriodSeconds {grace} <= --stop-timeout {timeout:g}"


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_output_dir_is_on_a_writable_claim_and_shm_in_memory(path):
    argv = launch_command(path)
    output_dir, dataset = option(argv, "--output-dir"), option(argv, "--dataset-path")
    for where, pod, container in kubernetes_pods(path):
        assert container is not None, where
        mount, volume = mounted_volume(pod, container, output_dir)
        assert volume is not None, f"{where}: --output-dir {output_dir} is on no mounted volume (lost with the pod)"
        assert "persistentVolumeClaim" in volume, f"{where}: {output_dir} is on {volume}, not a PersistentVolumeClaim"
        assert not mount.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly"), where
        assert mounted_volume(pod, container, dataset)[1] is not None, f"{where}: --dataset-path {dataset} unmounted"
        mount, volume = mounted_volume(pod, container, "/dev/shm")
        assert mount is not None and mount["mountPath"] == "/dev/shm", f"{where}: /dev/shm keeps the node's 64 MB"
        assert volume.get("emptyDir", {}).get("medium") == "Memory", f"{where}: /dev/shm is {volume}"


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_file_runs_this_projects_image_with_a_gpu_per_process(path):
    doc = load(path)
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"]["trainer"]
        images = [trainer["image"]]
        gpus = [(trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"], trainer["numProcPerNode"])]
    else:
        containers = [container for _, _, container in kubernetes_pods(path)]
        images = [container["image"] for container in containers]
        gpus = [(container["resources"]["limits"]["nvidia.com/gpu"], doc["spec"]["nprocPerNode"])
                for container in containers]
    for image in images:
        name = image.rsplit("/", 1)[-1]  # a registry in front is the user's choice
        assert name == f"{SLUG}:latest", f"image {image!r} is not the project's ({SLUG}:latest)"
    for limit, processes in gpus:
        assert int(limit) == int(processes), f"{limit} GPUs for {processes} processes per node"
    dockerfile = (PROJECT / "Dockerfile").read_text()
    assert f"WORKDIR /workspace/{SLUG}\n" in dockerfile, "the command's relative paths need the project as WORKDIR"


def test_skypilot_output_dir_is_in_a_bucket_mounted_on_every_node():
    doc = load(SKYPILOT)
    argv = launch_command(SKYPILOT)
    output_dir, dataset = option(argv, "--output-dir"), option(argv, "--dataset-path")
    mounts = doc.get("file_mounts", {})
    holding = [target for target in mounts if PurePosixPath(output_dir).is_relative_to(target)]
    assert holding, f"--output-dir {output_dir} is on no file_mount: it would be lost with the cluster"
    bucket = mounts[max(holding, key=len)]
    assert isinstance(bucket, dict) and bucket.get("mode", "MOUNT") == "MOUNT", (
        f"{bucket}: MOUNT writes a checkpoint to the bucket when it is closed (COPY never writes back, "
        "MOUNT_CACHED uploads later)")
    assert any(PurePosixPath(dataset).is_relative_to(target) for target in mounts), f"{dataset} is not mounted"


TRACKER_SECRET = "tracker-credentials"
STORE_SECRET = "object-store-credentials"
"""The Secret of the S3 endpoint and credentials of shards on ``s3://`` (the large corpora part)."""
STORE_NAMES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"}


def secret_refs(container: dict, secret: str) -> list:
    """The ``envFrom`` entries of a container that name the Secret ``secret``."""
    return [ref for ref in container.get("envFrom") or [] if ref["secretRef"]["name"] == secret]
"""The Kubernetes Secret the manifests read the experiment trackers' credentials from (``utils/tracking``)."""


def test_tracker_credentials_reach_every_node_from_an_optional_secret_and_none_is_written():
    """With the experiment trackers: the TrainJob's trainer and every PyTorchJob container take their credentials
    from the Secret, optional (a job starts without it); SkyPilot's are empty until given at launch (``--secret``,
    ``--env``). Without the trackers, no launch file names them."""
    trainer_env = [item for item in load(TRAINJOB)["spec"]["trainer"].get("env", [])
                   if item["valueFrom"]["secretKeyRef"]["name"] == TRACKER_SECRET]
    env_from = [secret_refs(container, TRACKER_SECRET) for _, _, container in kubernetes_pods(PYTORCHJOB)]
    sky = load(SKYPILOT)
    sky["secrets"] = {name: value for name, value in sky.get("secrets", {}).items() if not name.startswith("AWS_")}
    if not (PROJECT / "utils" / "tracking").is_dir():
        assert (trainer_env, env_from, sky["secrets"], sky.get("envs")) == ([], [[], []], {}, None)
        return
    refs = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in trainer_env}
    assert set(refs) == {"WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"}
    assert all(ref == {"name": TRACKER_SECRET, "key": name, "optional": True} for name, ref in refs.items())
    assert env_from == [[{"secretRef": {"name": TRACKER_SECRET, "optional": True}}]] * 2  # Master and Worker
    assert sky["secrets"] == {"WANDB_API_KEY": ""} and sky["envs"] == {"MLFLOW_TRACKING_URI": ""}


def test_object_store_credentials_reach_every_node_from_an_optional_secret_and_none_is_written():
    """With the large corpora part (shards on ``s3://``): the TrainJob's trainer takes the S3 endpoint, region and
    credentials from the Secret, each optional, and every PyTorchJob container all its keys (optional: a job starts
    without it); SkyPilot's credentials are empty until given at launch (``--secret``). Without the part, no launch
    file names them."""
    trainer = {item["name"]: item["valueFrom"]["secretKeyRef"]
               for item in load(TRAINJOB)["spec"]["trainer"].get("env", []) if item["name"].startswith("AWS_")}
    env_from = [secret_refs(container, STORE_SECRET) for _, _, container in kubernetes_pods(PYTORCHJOB)]
    sky = {name: value for name, value in (load(SKYPILOT).get("secrets") or {}).items() if name.startswith("AWS_")}
    if not (PROJECT / "utils" / "data" / "shar_store.py").is_file():
        assert (trainer, env_from, sky) == ({}, [[], []], {})
        assert not any("AWS_" in path.read_text() for path in LAUNCH_FILES)
        return
    assert trainer == {name: {"name": STORE_SECRET, "key": name, "optional": True} for name in STORE_NAMES}
    assert env_from == [[{"secretRef": {"name": STORE_SECRET, "optional": True}}]] * 2  # Master and Worker
    assert sky == {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
