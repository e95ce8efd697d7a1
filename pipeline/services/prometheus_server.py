"""Debian's prometheus as a local process, scraping every stage through file-based discovery.

Its configuration (deploy/prometheus/prometheus-native.yml) and recording rules (shared with
the compose Prometheus) are written next to its data; each stage's exporter drops a target
file into ``settings.prometheus_targets_dir``. A running Prometheus of ours whose configuration
is stale is reloaded by ``up``. Healthy when ``/-/ready`` answers 200. (layer: services)
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from string import Template

from pipeline.io import config
from pipeline.io.probes import prometheus_answers
from pipeline.services.native import NativeService, ServiceError
from pipeline.services.process import PidRecord


def _prometheus_reload_state(url: str) -> tuple[float | None, bool | None]:
    """When Prometheus last loaded its configuration successfully, and whether the last
    attempt succeeded (None, None when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None, None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "prometheus_config_last_reload_success_timestamp_seconds",
            "prometheus_config_last_reload_successful",
        ):
            values[name] = float(value)
    stamp = values.get("prometheus_config_last_reload_success_timestamp_seconds")
    successful = values.get("prometheus_config_last_reload_successful")
    return stamp, None if successful is None else successful == 1.0


class PrometheusService(NativeService):
    """Debian's prometheus with deploy/prometheus/prometheus-native.yml."""

    name = "prometheus"
    start_timeout = 30.0

    @property
    def address(self) -> str:
        return self.settings.prometheus_url

    @property
    def config_path(self) -> Path:
        return self.data_dir / "prometheus.yml"

    def install(self) -> None:
        self._require_binary("prometheus")

    @property
    def listen_address(self) -> str:
        return f"{self.settings.prometheus_host}:{self.settings.prometheus_port}"

    @property
    def rules_path(self) -> Path:
        """The recording rules, copied next to the configuration (which names them)."""
        return self.data_dir / "rules.yml"

    @property
    def targets_dir(self) -> Path:
        return self.settings.prometheus_targets_dir

    def prometheus_config(self) -> str:
        """deploy/prometheus/prometheus-native.yml with this machine's address and the folder
        of the stages' target files."""
        template = Template(
            (config.DEPLOY_DIR / "prometheus" / "prometheus-native.yml").read_text()
        )
        return template.substitute(
            prometheus_address=self.listen_address, targets_dir=self.targets_dir
        )

    def rules(self) -> str:
        """deploy/prometheus/rules.yml, shared with the compose Prometheus."""
        return (config.DEPLOY_DIR / "prometheus" / "rules.yml").read_text()

    def write_config(self) -> bool:
        """Write the rules and the configuration where they differ; True if one changed."""
        changed = False
        # Rules first: the configuration names them, and a reload reads both.
        wanted = ((self.rules_path, self.rules()), (self.config_path, self.prometheus_config()))
        for path, text in wanted:
            if not path.exists() or path.read_text() != text:
                temporary = path.with_name(f".{path.name}.tmp")
                temporary.write_text(text)
                temporary.replace(path)
                changed = True
        return changed

    def prepare(self) -> None:
        super().prepare()
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()

    def reconfigure(self, record: PidRecord) -> bool:
        """A running Prometheus of ours whose configuration or rules are stale (an older
        checkout started it) or whose last reload failed: write them and reload (SIGHUP);
        ServiceError if Prometheus rejects them."""
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        before, successful = _prometheus_reload_state(self.settings.prometheus_url)
        if not self.write_config() and successful is not False:
            return False
        os.kill(record.pid, signal.SIGHUP)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            stamp, successful = _prometheus_reload_state(self.settings.prometheus_url)
            if stamp is not None and (before is None or stamp > before) and successful:
                return True
            if stamp is not None and successful is False:
                break
            time.sleep(0.2)
        raise ServiceError(
            f"prometheus did not load the new configuration {self.config_path}; see {self.log_path}"
        )

    def command(self) -> list[str]:
        return [
            "prometheus",
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'data'}",
            "--storage.tsdb.retention.time=2d",
            f"--web.listen-address={self.listen_address}",
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return prometheus_answers(self.settings.prometheus_url, timeout)
