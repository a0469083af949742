"""The launch files of ``scripts/kubeflow/`` and ``scripts/skypilot/``, checked with the platforms' own clients: each
is a valid document of its platform. Fast: nothing is trained and no cluster is needed. What the files run and where
they keep the run (the project's side) is ``tests/test_launch_settings.py``.

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

Without the clients these tests are skipped: ``pip install -r requirements-launch.txt``.
"""

import copy
import datetime
import re
import shlex
import typing
from pathlib import Path

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
