"""Plans that outlive the process (issue 47): with TENSOR_ARENA_PLANS (or
configure(plans=DIR)), a fresh process serves the shapes an earlier one
saw on their exact plans from the first run, with the same outputs as
onnxruntime's; a corrupt store is one warning and a start with no plans."""

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from tensor_arena import onnxruntime as ta
    import onnxruntime as ort
    model = sys.argv[1]
    sess = ta.InferenceSession(model)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out = []
    for i, width in enumerate([160, 320, 640, 480]):
        x = np.random.default_rng(i).random((1, 3, 48, width), dtype=np.float32)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        same = all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        out.append([width, sess.last_run()["plan"], same])
    print(json.dumps(out))
    """
)


def child(assets, plans, extra_env=None):
    env = dict(os.environ, TENSOR_ARENA_PLANS=str(plans), **(extra_env or {}))
    r = subprocess.run([sys.executable, "-c", CHILD, str(assets / "ppocr_rec.onnx")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_fresh_process_is_planned_from_an_earlier_ones_store(assets, tmp_path):
    first, _ = child(assets, tmp_path)
    assert [p for _, p, _ in first][0] == "dynamic", first
    assert all(same for _, _, same in first), first
    stores = list(tmp_path.glob("*.plans"))
    assert len(stores) == 1, stores  # saved at exit
    second, err = child(assets, tmp_path)
    assert "plan store" not in err, err
    assert [p for _, p, _ in second] == ["exact"] * 4, second
    assert all(same for _, _, same in second), second


def test_a_corrupt_store_is_one_warning_and_no_plans(assets, tmp_path):
    child(assets, tmp_path)
    (store,) = tmp_path.glob("*.plans")
    data = bytearray(store.read_bytes())
    data[len(data) // 2] ^= 0x40
    store.write_bytes(bytes(data))
    runs, err = child(assets, tmp_path)
    warnings = [line for line in err.splitlines() if "plan store" in line]
    assert len(warnings) == 1 and "checksum" in warnings[0], err
    assert runs[0][1] == "dynamic", runs
    assert all(same for _, _, same in runs), runs
