"""Starts N processes of fit_worker.py multi_worker K on 127.0.0.1 (run it inside a private network namespace)
and prints the chief's last line, after checking that every worker ended well. For test_fit_distribute.py.

    python fit_workers_runner.py N K [OUTPUT_DIR]"""

import json
import os
import subprocess
import sys
from pathlib import Path

from accum_train.from_config.launcher import free_ports

workers, k, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
ports = free_ports(workers)
cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
processes = [
    subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fit_worker.py")), "multi_worker", k, *rest],
        env={**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for i in range(workers)
]
outputs = [p.communicate(timeout=240) for p in processes]
for i, (p, (_, err)) in enumerate(zip(processes, outputs)):
    if p.returncode != 0:
        sys.exit(f"worker {i} exited with {p.returncode}: {err[-3000:]}")
print(outputs[0][0].strip().splitlines()[-1])
