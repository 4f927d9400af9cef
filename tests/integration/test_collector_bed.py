"""The bed's collector refuses what a node may not send, with real munged per node.

Each node of the bed has its own munged (the bed's key, --origin = the node's address in
its network namespace: docker/slurm-cluster/collector.sh), so a credential says which node
made it. A batch signed by a non-root user, a credential used twice, and a batch made on
gpu1 that claims to be gpu2's are each refused with 403; the reason is in the answer, in
the collector's log and in its /metrics refusal counter.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from slurm_gpu.collector.wire import CREDENTIAL_HEADER, PATH, digest, encode_batch
from slurm_gpu.munge import Libmunge
from tests.integration.testbed import TestBed

pytestmark = pytest.mark.slurm


def empty_batch(node: str) -> tuple[bytes, str]:
    """The body of a batch of no rows claiming to come from `node`, and its id."""
    batch_id = f"{node}:test-{uuid.uuid4().hex[:12]}"
    return encode_batch(node, batch_id, time.time(), []), batch_id


def post(bed: TestBed, body: bytes, credential: str) -> tuple[int, dict[str, object]]:
    """POSTs a batch to the bed's collector: (status, the JSON answer)."""
    request = urllib.request.Request(
        bed.collector_url + PATH,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", CREDENTIAL_HEADER: credential},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def refused_count(bed: TestBed, reason: str) -> float:
    """slurm_gpu_collector_refused_total{reason=...} from the collector's /metrics."""
    with urllib.request.urlopen(bed.collector_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    series = f'slurm_gpu_collector_refused_total{{reason="{reason}"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(series)]
    return float(line.split()[-1])


def logged_refusal(bed: TestBed, batch_id: str) -> str:
    """The collector's log line about `batch_id` ("" when there is none yet)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [ln for ln in bed.collector_log.read_text().splitlines() if batch_id in ln]
        if lines:
            return lines[-1]
        time.sleep(0.2)
    return ""


def root_credential(bed: TestBed, node: str, body: bytes) -> str:
    """A credential of root from `node`'s munged over the body's digest, as its agent signs."""
    return Libmunge(str(bed.munge_socket(node))).encode(digest(body).encode())


@pytest.fixture(scope="module")
def bed(testbed: TestBed) -> TestBed:
    if not testbed.through_collector:
        pytest.fail("the bed runs SLURM_GPU_BED_STORE=sqlite: it has no collector to test")
    return testbed


def refusal(
    bed: TestBed, body: bytes, credential: str, batch_id: str, reason: str
) -> tuple[int, object, bool, float]:
    """(status, answer's reason, logged line has the reason, counter went up by one)."""
    before = refused_count(bed, reason)
    status, answer = post(bed, body, credential)
    line = logged_refusal(bed, batch_id)
    return status, answer.get("error"), f"403 {reason}" in line, refused_count(bed, reason) - before


def test_the_nodes_own_root_credential_is_taken(bed: TestBed) -> None:
    """The baseline the refusals differ from: gpu1's root credential for gpu1's batch."""
    body, _ = empty_batch("gpu1")
    assert post(bed, body, root_credential(bed, "gpu1", body)) == (200, {"rows": 0})


def test_a_batch_signed_by_a_user_is_refused(bed: TestBed) -> None:
    """alice on gpu1 signs with libmunge on gpu1's munged: 403 non_root."""
    body, batch_id = empty_batch("gpu1")
    venv = Path(bed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
    program = (
        "import sys\nfrom slurm_gpu.munge import Libmunge\n"
        "print(Libmunge(sys.argv[1]).encode(sys.argv[2].encode()))"
    )
    credential = subprocess.run(
        ["runuser", "-u", "alice", "--", str(venv / "bin/python"), "-c", program,
         str(bed.munge_socket("gpu1")), digest(body)],
        check=True, capture_output=True, text=True, timeout=30, cwd="/",
    ).stdout.strip()  # fmt: skip
    assert refusal(bed, body, credential, batch_id, "non_root") == (403, "non_root", True, 1)


def test_a_replayed_credential_is_refused(bed: TestBed) -> None:
    """The same body and credential twice: taken once, then 403 replayed."""
    body, batch_id = empty_batch("gpu2")
    credential = root_credential(bed, "gpu2", body)
    assert post(bed, body, credential) == (200, {"rows": 0})
    assert refusal(bed, body, credential, batch_id, "replayed") == (403, "replayed", True, 1)


def test_a_batch_claiming_another_node_is_refused(bed: TestBed) -> None:
    """Made by root on gpu1 (gpu1's munged), claiming gpu2: 403 wrong_node."""
    body, batch_id = empty_batch("gpu2")
    credential = root_credential(bed, "gpu1", body)
    assert refusal(bed, body, credential, batch_id, "wrong_node") == (403, "wrong_node", True, 1)
