"""gpumem: a caching GPU memory allocator and memory forensics for PyTorch.

Install it as PyTorch's CUDA allocator before CUDA starts, then use PyTorch as usual; torch's own
memory APIs (``torch.cuda.memory_stats``, ``memory_allocated``, ``empty_cache``, ``_snapshot``, ...)
report gpumem::

    import torch
    import gpumem

    gpumem.install()                      # or gpumem.install("expandable_segments:True,oom_report_dir:/tmp/oom")
    model = MyModel().cuda()              # every CUDA tensor now comes from gpumem
    ...
    print(gpumem.stats()["reserved_bytes.all.peak"])
    report = gpumem.report(gpumem.snapshot())   # where the memory went, as a dict
    print(report["verdict"] if "verdict" in report else report["reserved_bytes"])

The configuration is the string ``GPUMEM_ALLOC_CONF`` takes (PyTorch's ``PYTORCH_CUDA_ALLOC_CONF``
keys plus gpumem's own; see docs/config.md), or a mapping of its keys. ``gpumem.install_cpu()``
serves CPU tensors the same way (and needs no GPU). The ``gpumem`` command (also
``python -m gpumem``) reports on, compares, replays and views snapshot and trace files.

Nothing happens at ``import gpumem``: the library is loaded by the first call that needs it.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Union

from ._paths import bundled_lib_dir, cli_environment, cli_path, library_path

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "ConfigError",
    "GpumemError",
    "InstallError",
    "check_config",
    "cli_path",
    "config_string",
    "dump_snapshot",
    "install",
    "install_cpu",
    "is_installed",
    "library_path",
    "load",
    "record_ops",
    "report",
    "reset_peak_stats",
    "snapshot",
    "stats",
    "step",
    "__version__",
]

try:
    from ._build_info import GPUMEM_VERSION as __version__
    from ._build_info import TORCH_VERSION as _BUILT_FOR_TORCH
except ImportError:  # running from the source tree without a build
    __version__ = "0.0.0+source"
    _BUILT_FOR_TORCH = ""

ConfigValue = Union[str, int, float, bool]
ConfigLike = Union[str, Mapping[str, ConfigValue], None]
DeviceLike = Union[str, int, "torch.device", None]
SnapshotLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# The variables gpumem reads its configuration from, in order (gpumem/torch/config.h).
_CONFIG_VARIABLES = ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class GpumemError(RuntimeError):
    """An error gpumem reports (the message names the problem and the fix)."""


class ConfigError(GpumemError, ValueError):
    """A configuration gpumem cannot parse; the message is the parser's (key, value, accepted forms)."""


class InstallError(GpumemError):
    """gpumem cannot be installed now: CUDA already started, or it is installed with another configuration."""


_load_lock = threading.Lock()
_loaded = False


def _torch() -> Any:
    import torch

    return torch


def _check_torch_version(torch: Any) -> None:
    if not _BUILT_FOR_TORCH:
        return
    built = _BUILT_FOR_TORCH.split("+")[0].split(".")[:2]
    running = str(torch.__version__).split("+")[0].split(".")[:2]
    if built != running:
        raise ImportError(
            f"gpumem was built against torch {_BUILT_FOR_TORCH} but this process runs torch {torch.__version__}; "
            "libtorch's C++ interface differs between minor versions. Reinstall gpumem with this torch "
            "(pip install --no-build-isolation --force-reinstall <gpumem source>)."
        )


def load() -> None:
    """Loads ``libgpumem_torch.so`` into torch (``torch.ops.gpumem.*``) once per process.

    Loading installs nothing, except that, as with ``torch.ops.load_library(path)``, a set
    ``GPUMEM_ALLOC_CONF`` makes the library install itself as the CUDA allocator right away (a
    failure there is kept and reported by :func:`install`). :func:`install`, :func:`stats` and the
    other functions call this first; call it yourself only to reach ``torch.ops.gpumem`` directly.
    """
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        torch = _torch()
        _check_torch_version(torch)
        path = library_path()
        # The shared libraries bundled beside it (libfmt) first; torch's and CUDA's are loaded by
        # `import torch` already.
        lib_dir = Path(bundled_lib_dir())
        if lib_dir.is_dir():
            for dep in sorted(lib_dir.glob("lib*.so*")):
                # libgpumem_torch.so itself is loaded below; libgpumem_pinned_torch.so only on
                # demand, by libgpumem_torch.so, for pinned_allocator:gpumem (it carries jemalloc).
                if dep.name.startswith(("libgpumem_", "libncurses", "libtinfo")):
                    continue
                ctypes.CDLL(str(dep), mode=ctypes.RTLD_GLOBAL)
        if not _ops_available(torch):
            try:
                torch.ops.load_library(path)
            except OSError:
                # With GPUMEM_ALLOC_CONF set the library installs itself as it loads, and a failed
                # install raises here although the library did load. check_config() and install()
                # report that problem in their own words; only a load that registered nothing is fatal.
                if not _ops_available(torch):
                    raise
        _loaded = True


def _ops_available(torch: Any) -> bool:
    try:
        torch.ops.gpumem.installed
    except (AttributeError, RuntimeError):
        return False
    return True


def config_string(config: ConfigLike) -> str:
    """The configuration as gpumem's ``key:value,...`` string.

    ``None`` gives ``""`` (meaning: read ``GPUMEM_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF``,
    else ``PYTORCH_ALLOC_CONF``). A mapping is joined in its order; booleans are written ``True`` /
    ``False`` as PyTorch spells them::

        config_string({"expandable_segments": True, "memory_limit_mb": 512})
        # 'expandable_segments:True,memory_limit_mb:512'
    """
    if config is None:
        return ""
    if isinstance(config, str):
        return config
    if isinstance(config, Mapping):
        parts = []
        for key, value in config.items():
            if not isinstance(key, str):
                raise ConfigError(f"gpumem: configuration keys are strings; got {key!r}")
            text = ("True" if value else "False") if isinstance(value, bool) else str(value)
            parts.append(f"{key}:{text}")
        return ",".join(parts)
    raise TypeError(f"gpumem: a configuration is a string, a mapping of keys to values, or None; got {type(config).__name__}")


def check_config(config: ConfigLike) -> str:
    """Parses the configuration without installing anything; returns its string.

    Raises :class:`ConfigError` with the parser's message (the key, the value, the accepted forms,
    the nearest key for a misspelt one) if it is not valid. ``None`` checks the environment's
    string (the first of ``GPUMEM_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF`` that is set).
    """
    text = config_string(config)
    source = "the configuration"
    if config is None:
        for name in _CONFIG_VARIABLES:
            if os.environ.get(name) is not None:
                text, source = os.environ[name], name
                break
    load()
    error = str(_torch().ops.gpumem.check_config(text))
    if error:
        raise ConfigError(error if source == "the configuration" else f"{source}: {error}")
    return text


def install(config: ConfigLike = None) -> None:
    """Makes gpumem PyTorch's CUDA allocator, with ``config`` (``None``: from the environment).

    Call it before CUDA is initialized (before the first CUDA tensor, ``torch.cuda.init()``, or
    anything that starts CUDA), normally right after ``import torch``. Installing again with an equal
    configuration does nothing. ``pinned_allocator:gpumem`` in the configuration also makes gpumem's
    pinned host allocator PyTorch's (``pin_memory()``, ``DataLoader(pin_memory=True)``); the package
    ships it when it was built with it (``gpumem._build_info.PINNED_ALLOCATOR``).

    Raises :class:`ConfigError` for a configuration gpumem cannot parse, and :class:`InstallError`
    when CUDA has already started (tensors made by PyTorch's allocator would otherwise be freed by
    gpumem) or gpumem is already installed with a different configuration.
    """
    torch = _torch()
    text = config_string(config)
    check_config(config)
    ops = torch.ops.gpumem
    if not bool(ops.installed()) and torch.cuda.is_initialized():
        raise InstallError(
            "gpumem.install() must run before CUDA is initialized in this process, but CUDA has started "
            "(a CUDA tensor was created, or torch.cuda.init() / a CUDA call ran), so PyTorch's own allocator "
            "already serves CUDA memory. Call gpumem.install() right after `import torch`, before any CUDA work."
            + (f" (Loading the library with GPUMEM_ALLOC_CONF set also failed: {ops.load_error()})" if ops.load_error() else "")
        )
    try:
        ops.install(text)
    except RuntimeError as e:
        raise InstallError(str(e).split("\nException raised from")[0]) from None


def install_cpu(config: ConfigLike = None) -> None:
    """Makes gpumem c10's CPU allocator (CPU tensors from gpumem's engine on host memory).

    Works on machines without a GPU. The ``source`` key is ignored (the CPU engine always uses
    host memory); the other keys apply (``memory_limit_mb``, ``oom_report_dir``, ``trace_entries``, ...).
    Raises :class:`ConfigError` for a bad configuration and :class:`InstallError` if the CPU
    allocator is gpumem's already with a different configuration.
    """
    torch = _torch()
    text = config_string(config)
    if text:
        check_config(text)
    else:
        load()
    try:
        torch.ops.gpumem.install_cpu(text)
    except RuntimeError as e:
        raise InstallError(str(e).split("\nException raised from")[0]) from None


def is_installed(device: DeviceLike = "cuda") -> bool:
    """Whether gpumem serves ``device``'s tensors: ``"cuda"`` (the CUDA allocator) or ``"cpu"``.

    Never loads the library: ``False`` if it was not loaded in this process.
    """
    torch = sys.modules.get("torch")
    if torch is None or not _ops_available(torch):
        return False
    kind = _device_type(device)
    return bool(torch.ops.gpumem.cpu_installed() if kind == "cpu" else torch.ops.gpumem.installed())


def _device_type(device: DeviceLike) -> str:
    """"cuda" or "cpu", without asking CUDA which device is current."""
    if device is None or isinstance(device, int):
        return "cuda"
    kind = _torch().device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"gpumem serves CUDA devices and the CPU, not {device}")
    return kind


def _device(device: DeviceLike) -> "torch.device":
    torch = _torch()
    if device is None:
        device = "cuda"
    if isinstance(device, int):
        return torch.device("cuda", device)
    d = torch.device(device)
    if d.type not in ("cuda", "cpu"):
        raise ValueError(f"gpumem serves CUDA devices and the CPU, not {d}")
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
    return d


def stats(device: DeviceLike = "cuda") -> Dict[str, int]:
    """gpumem's statistics for ``device`` under ``torch.cuda.memory_stats()``'s keys, plus gpumem's own.

    Works however gpumem was installed (also under ``CUDAPluggableAllocator``, where
    ``torch.cuda.memory_stats()`` raises) and for the CPU engine (``device="cpu"``). A device gpumem
    has not served yet reads as zeros.

    gpumem's own keys include where time goes outside the allocator's bookkeeping:
    ``gpumem.driver.<call>.calls`` / ``.ns`` / ``.max_ns`` for the CUDA driver's virtual memory
    calls (``address_reserve``, ``address_free``, ``create``, ``release``, ``map``, ``set_access``,
    ``unmap``), ``gpumem.wait.sync_stream.*`` / ``gpumem.wait.sync_event.*`` for stream and event
    waits and ``gpumem.event.record.*`` / ``gpumem.event.query.*``: cumulative host nanoseconds since
    the engine was made (take differences). ``gpumem.driver.timed`` / ``gpumem.wait.timed`` are 0,
    and those keys 0, when the source is not the CUDA VMM one (docs/torch_adapter.md).
    ``gpumem.thread_caches.on`` is 1 once two threads met in the engine and its thread caches came
    on (it never goes back to 0). ``gpumem.arenas`` is the number of engines serving the device:
    with arenas (``arenas:auto``, the default) threads that keep meeting in an engine's lock get
    engines of their own, up to four, and threads that share one share its caches. ``gpumem.engine_lock.acquisitions`` /
    ``.contended`` count the allocations and frees that took an engine's lock, and those that found
    another thread holding it (summed over the engines). ``gpumem.step_plan.on`` is 1 with ``step_plan:True`` (the default), and ``gpumem.step_plan.*`` say what
    the step planner did: steps found, plans, fallbacks, allocations and steps served from its
    layout, the arena in use.
    """
    load()
    return {str(k): int(v) for k, v in _torch().ops.gpumem.memory_stats(_device(device)).items()}


def record_ops(enabled: bool = True) -> bool:
    """Turns per-op attribution on or off while the program runs; returns whether it was on.

    On, every allocator event is tagged with the PyTorch operator (and ``record_function`` scope)
    it happened in, as the ``record_ops:True`` setting does from the start: the tags reach the
    trace (``torch.cuda.memory._record_memory_history``, ``oom_report_dir``) and, when the
    process started with ``record_ops:True``, the live blocks of snapshots. Off, libtorch runs
    its ops without gpumem's callback (no per-op cost) and new events name no op. Use it to
    attribute a few steps of a long run, or to measure what attribution costs in one process.
    Works from any thread, with or without gpumem installed.
    """
    if not isinstance(enabled, bool):
        raise TypeError("gpumem.record_ops(enabled): enabled must be True or False, not %r" % (enabled,))
    load()
    return bool(_torch().ops.gpumem.record_ops(enabled))


def step(device: DeviceLike = "cuda") -> None:
    """Tells gpumem's step planner that a training step starts (call it at the top of each step).

    With ``step_plan:True`` (the default) the planner then learns the step from these marks
    instead of finding its length itself (the first call turns its own detection off). With
    ``step_plan:False``, or before gpumem serves ``device``, it does nothing. ``stats()`` has the planner's ``gpumem.step_plan.*``
    keys (docs/torch_adapter.md).
    """
    load()
    _torch().ops.gpumem.mark_step(_device(device))


def reset_peak_stats(device: DeviceLike = "cuda") -> None:
    """Sets every peak statistic of ``device`` to its current value."""
    load()
    _torch().ops.gpumem.reset_peak_stats(_device(device))


def dump_snapshot(path: Union[str, "os.PathLike[str]"], device: DeviceLike = "cuda") -> str:
    """Writes ``device``'s snapshot to ``path`` and returns the path.

    The file is what ``torch.cuda.memory._dump_snapshot`` writes (a pickle; JSON when the name ends
    in ``.json``) with gpumem's additions; PyTorch's memory_viz, ``gpumem report`` and ``gpumem view``
    open it. The trace holds the last ``trace_entries`` events (configuration key) or what
    ``torch.cuda.memory._record_memory_history`` asked for.
    """
    load()
    target = os.fspath(path)
    try:
        _torch().ops.gpumem.write_snapshot(_device(device), target)
    except RuntimeError as e:
        raise GpumemError(str(e).split("\nException raised from")[0]) from None
    return target


def snapshot(device: DeviceLike = "cuda") -> Dict[str, Any]:
    """``device``'s snapshot as a dict in PyTorch's layout (``segments``, ``device_traces``, ...).

    The same dict ``torch.cuda.memory._snapshot()`` gives, made by gpumem for any device it serves
    (the CPU engine included), with gpumem's additions. Pass it to :func:`report`.
    """
    with tempfile.TemporaryDirectory(prefix="gpumem-snapshot-") as tmp:
        path = dump_snapshot(os.path.join(tmp, "snapshot.pickle"), device)
        with open(path, "rb") as f:
            return dict(pickle.load(f))


def report(snapshot_or_path: SnapshotLike, *, top: int = 10, device: Optional[int] = None,
           replay: bool = True) -> Dict[str, Any]:
    """The memory report of a snapshot, as a dict: what ``gpumem report FILE --json`` prints.

    ``snapshot_or_path`` is a snapshot dict (:func:`snapshot`, ``torch.cuda.memory._snapshot()``) or
    the path of a snapshot or trace file (PyTorch's pickle, gpumem's pickle or JSON, a CSV trace).
    Keys include ``reserved_bytes``, ``allocated_bytes``, ``fragmentation``, ``top_ops``,
    ``top_sites`` and, when the file records an out-of-memory error, ``verdict`` (capacity,
    fragmentation, pending_frees or outside_memory) with the numbers behind it. ``top`` rows per
    list; ``device``: which device to report on (default: the one with an OOM, else the first with
    a trace); ``replay=False`` skips replaying the trace under gpumem's policy for the OOM advice.
    Raises :class:`GpumemError` with the tool's message if the file cannot be read.
    """
    args = ["report", "", "--json", "--top", str(int(top))]
    if device is not None:
        args += ["--device", str(int(device))]
    if not replay:
        args.append("--no-replay")
    if isinstance(snapshot_or_path, Mapping):
        with tempfile.TemporaryDirectory(prefix="gpumem-report-") as tmp:
            path = os.path.join(tmp, "snapshot.pickle")
            with open(path, "wb") as f:
                pickle.dump(dict(snapshot_or_path), f)
            args[1] = path
            return _run_report(args)
    args[1] = os.fspath(snapshot_or_path)
    return _run_report(args)


def _run_report(args: list) -> Dict[str, Any]:
    done = subprocess.run([cli_path(), *args], env=cli_environment(), capture_output=True, text=True)
    if done.returncode != 0:
        raise GpumemError(done.stderr.strip() or f"gpumem report exited with status {done.returncode}")
    try:
        return dict(json.loads(done.stdout))
    except json.JSONDecodeError as e:
        raise GpumemError(f"gpumem report printed something that is not JSON ({e}): {done.stdout[:200]!r}") from None
