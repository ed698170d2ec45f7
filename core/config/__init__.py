"""The runtime file: its model, loading, and the offline check (CONTRACT §5).

``load_runtime_file`` gives a :class:`RuntimeConfig` whose every self-contained rule holds;
``check_runtime_file`` also verifies the pinned packages and the rules that involve them.
Neither reads a secret: resolve references with :class:`core.secrets.SecretResolver`.
"""

from core.config.check import check_config, check_runtime_file
from core.config.load import load_runtime_file, parse_runtime
from core.config.model import CheckedDeployment, RuntimeConfig

__all__ = [
    "CheckedDeployment",
    "RuntimeConfig",
    "check_config",
    "check_runtime_file",
    "load_runtime_file",
    "parse_runtime",
]
