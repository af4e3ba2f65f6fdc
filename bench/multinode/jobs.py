"""Ray's job server on the harness's head and jobs submitted to it as a user submits them.

The head runs Ray's dashboard (``ray start --head --include-dashboard=true
--dashboard-host=HEAD_IP``), whose job server listens on the head's bridge address; a job is
``ray job submit --address http://HEAD_IP:8265 -- ENTRYPOINT`` run in the root namespace (the
bridge reaches the head).  The cluster runs with token auth (``RAY_AUTH_MODE=token``): the
CLI takes the token from ``RAY_AUTH_TOKEN`` in its environment, the queries here send it as
``Authorization: Bearer TOKEN``.  Ray runs a job's entrypoint on the head (in its namespace),
with the head's environment: every node has the checkout's virtualenv (one file system), so
a job needs no ``working_dir`` or runtime environment.  The same server takes a Serve config
(``serve deploy CONFIG --address http://HEAD_IP:8265``, Serve's REST API), as on a cluster of
``ray up``.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import services
from . import processes

JOB_PORT = 8265
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
POLL_S = 0.5


class JobError(RuntimeError):
    pass


@dataclass(frozen=True)
class JobServer:
    """The job server at ``address`` (``http://HEAD_IP:8265``); ``env`` holds the cluster's
    ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN``."""

    address: str
    env: Mapping[str, str] = field(repr=False)

    def request(self, method: str, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        """``method path`` with the token; the status and the decoded JSON (or text)."""
        req = urllib.request.Request(self.address + path, method=method)
        req.add_header("Authorization", f"Bearer {self.env['RAY_AUTH_TOKEN']}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                status, body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode(errors="replace")
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def up(self) -> bool:
        """The server answers, and takes the cluster's token (``/api/jobs/`` is authenticated)."""
        try:
            return self.request("GET", "/api/version", 2.0)[0] == 200 and (
                self.request("GET", "/api/jobs/", 5.0)[0] == 200
            )
        except OSError:
            return False

    def wait_up(self, deadline: float) -> None:
        """Until :meth:`up`; raises once ``deadline`` (``time.monotonic``) passes."""
        while not self.up():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray's job server at {self.address} did not answer in time")
            time.sleep(POLL_S)

    def info(self, submission_id: str) -> dict[str, Any] | None:
        """The job's details (``status``, ``message``, ``driver_exit_code``…); ``None`` while
        the server does not know it (not submitted yet)."""
        status, body = self.request("GET", f"/api/jobs/{submission_id}")
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise JobError(f"job {submission_id}: {status} {body}")
        return body

    def jobs(self) -> list[dict[str, Any]]:
        status, body = self.request("GET", "/api/jobs/")
        if status != 200 or not isinstance(body, list):
            raise JobError(f"jobs: {status} {body}")
        return body

    def actors(self, **equal: str) -> list[dict[str, Any]]:
        """Ray's actors (alive and dead, as its state API keeps them), those whose fields
        equal ``equal`` (``job_id=…``, ``state="ALIVE"``, ``class_name=…``)."""
        query = [("limit", "10000"), ("detail", "true")]
        for key, value in equal.items():
            query += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        status, body = self.request("GET", "/api/v0/actors?" + urllib.parse.urlencode(query), 30.0)
        if status != 200 or not isinstance(body, dict) or not body.get("result"):
            raise JobError(f"actors: {status} {str(body)[:500]}")
        return list(body["data"]["result"]["result"])

    def stop_job(self, submission_id: str) -> None:
        """Ask Ray to stop the job (its driver is sent SIGTERM, then SIGKILL)."""
        self.request("POST", f"/api/jobs/{submission_id}/stop")

    def serve_deploy(self, config: Path, deadline: float) -> dict[str, str]:
        """``serve deploy CONFIG`` to this server, then wait until every application of the
        config runs; application name → status."""
        serve = str(Path(services.ray_command()).with_name("serve"))
        res = subprocess.run(
            [serve, "deploy", str(config), "--address", self.address],
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=max(10.0, deadline - time.monotonic()),
            check=False,
        )
        if res.returncode != 0:
            raise JobError(f"serve deploy {config} failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
        names = [a["name"] for a in json.loads(config.read_text())["applications"]]
        while True:
            status, body = self.request("GET", "/api/serve/applications/")
            apps = (body.get("applications") or {}) if status == 200 and isinstance(body, dict) else {}
            states = {n: str((apps.get(n) or {}).get("status", "MISSING")) for n in names}
            if all(s == "RUNNING" for s in states.values()):
                return states
            failed = {n: apps[n].get("message") for n in names if states[n] == "DEPLOY_FAILED"}
            if failed:
                raise JobError(f"deploy failed: {failed}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"applications not running in time: {states}")
            time.sleep(POLL_S)

    def submit(self, entrypoint: Sequence[str], log: Path, submission_id: str | None = None) -> Job:
        """``ray job submit`` of ``entrypoint``, following the job's logs into ``log`` until it
        ends (the CLI exits 1 when the job failed)."""
        sid = submission_id or f"rwsmn-{secrets.token_hex(4)}"
        cmd = [
            services.ray_command(),
            "job",
            "submit",
            f"--address={self.address}",
            f"--submission-id={sid}",
            "--",
            *entrypoint,
        ]
        return Job(self, sid, processes.launch(cmd, log, self.env), log)


@dataclass
class Job:
    """A submitted job: ``proc`` is the ``ray job submit`` following it, ``log`` its output."""

    server: JobServer
    submission_id: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def info(self) -> dict[str, Any] | None:
        """The job's details, or ``None`` while ``ray job submit`` has not submitted it yet;
        raises if the CLI exited without submitting it."""
        info = self.server.info(self.submission_id)
        if info is None and self.proc.poll() is not None:
            raise JobError(f"`ray job submit` exited {self.proc.returncode}:\n{self.output()[-4000:]}")
        return info

    def status(self) -> str:
        info = self.info()
        return "SUBMITTING" if info is None else str(info["status"])

    def wait_for_output(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Until the job's output matches ``pattern``; raises if the job ends first."""
        deadline = time.monotonic() + timeout_s
        while (m := re.search(pattern, self.output())) is None:
            if self.proc.poll() is not None:
                raise JobError(f"job {self.submission_id} ended before {pattern!r}:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.submission_id}: no {pattern!r} in {timeout_s:.0f}s")
            time.sleep(POLL_S)
        return m

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """Until the job ends; its details.  Past ``timeout_s`` the job is stopped and
        :class:`TimeoutError` raised."""
        deadline = time.monotonic() + timeout_s
        while (info := self.info()) is None or info["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"job {self.submission_id} not ended after {timeout_s:.0f}s: {info}")
            time.sleep(POLL_S)
        try:
            self.proc.wait(timeout=max(10.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            processes.stop(self.proc)
        return info

    def stop(self) -> None:
        """Stop the job if it runs, and the CLI following it."""
        try:
            if self.server.info(self.submission_id) is not None and self.status() not in TERMINAL:
                self.server.stop_job(self.submission_id)
        except (OSError, JobError):
            pass  # the server is gone: the job went with the head
        processes.stop(self.proc)
