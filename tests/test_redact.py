"""`export --bundle --redact public` (issue 30, item 10): one real run of a model file in a folder named
"My Projects/secret-project", its stored text then made to carry every form of identifying text (paths of
every shape, e-mail, host names, IPs) in every kind of column, exported through the real CLI; every text
column of every Parquet member and the manifest are searched for each secret."""

from __future__ import annotations

import json
import re
import socket
import zipfile
from pathlib import Path
from typing import Any

import duckdb
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import QUICK, run_cli
from onnx import TensorProto, helper

from harness.store import hash_results_sql, open_store

HOSTNAME = socket.gethostname()
# Each form the issue found surviving, planted in the run's stored text (the folder's path comes from the run).
FORMS = {
    "relative": "./work/secret-rel/model.onnx and secret-rel2/deeper/more and secret-rel3/weights.onnx",
    "unc": r"\\fileserver-x\share-x\Team Folder\model.onnx",
    "windows": r"C:\Users\Carol Smith\secret-win\model.onnx",
    "home": "~dave-secret and ~/secret-tilde/x.onnx",
    "file_url": "file:/home/erin-secret/model.onnx",
    "email": "frank.secret@example.org",
    "ray": "the result from Ray node gpu-node-secret (10.1.2.3) failed validation",
    "ipv6": "peer 2001:db8::42 and fe80::1%eth0 and 2001:0db8:0000:0000:0000:0000:0000:0099",
    "url": "http://203.0.113.7:8080/secret-url/x",
    "host": f"written on {HOSTNAME} by a job",
}
SECRETS = ["My Projects", "secret-project", "secret-rel", "fileserver-x", "share-x", "Team Folder", "Carol Smith",
           "secret-win", "dave-secret", "secret-tilde", "erin-secret", "file:/home", "frank.secret", "example.org",
           "gpu-node-secret", "10.1.2.3", "2001:db8", "fe80::1", ":0099", "203.0.113.7", "secret-url",
           "\\\\"]  # fmt: skip
KEPT = ["tiny-relu", "onnxruntime", "CPUExecutionProvider", "1.31.1", "bert-tiny", "3.25 ms", "pp/tg tokens/s"]
USEFUL = "bert-tiny on CPUExecutionProvider with onnxruntime 1.31.1 took 3.25 ms; pp/tg tokens/s"


def _relu(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def _plant(db: Path) -> None:
    """Every form in every kind of column: run arguments (JSON), the machine label, a hardware reason, an
    error text, a result's details (JSON, nested), and a measured column (a result's weights: where they were read)."""
    text = "; ".join(FORMS.values())
    with duckdb.connect(str(db)) as con:
        (arguments,) = con.execute("SELECT arguments FROM runs").fetchone()
        planted = json.loads(arguments) | {f"planted_{k}": v for k, v in FORMS.items()} | {"notes": [f"as: {text}"]}
        con.execute("UPDATE runs SET arguments = ?, machine_label = ?", [json.dumps(planted), FORMS["email"]])
        con.execute("UPDATE hardware SET reason = ?", [text])
        (result_id, details) = con.execute("SELECT result_id, details FROM results LIMIT 1").fetchone()
        nested = json.loads(details) | {"ray_node": {"hostname": "gpu-node-secret", "node_ip": "10.1.2.3"},
                                        "planted": {"forms": list(FORMS.values()), "useful": USEFUL}}  # fmt: skip
        con.execute(
            "UPDATE results SET error = ?, details = ?, weights = ? WHERE result_id = ?",
            [f"{text}; {USEFUL}", json.dumps(nested), FORMS["windows"], result_id],
        )
        con.execute("UPDATE results SET content_hash = NULL WHERE result_id = ?", [result_id])
        con.execute(hash_results_sql("result_id = ?"), [result_id, result_id])  # as if measured so


def _texts(bundle: Path) -> dict[str, list[str]]:
    """Every text cell of every Parquet member (by member and column), and the manifest."""
    found: dict[str, list[str]] = {}
    with zipfile.ZipFile(bundle) as archive:
        for name in archive.namelist():
            data = archive.read(name)
            if not name.endswith(".parquet"):
                found[name] = [data.decode()]
                continue
            table = pq.read_table(pa.BufferReader(data))
            for column in table.column_names:  # VARCHAR and JSON (an extension type) columns alike
                found[f"{name}:{column}"] = [v for v in table.column(column).to_pylist() if isinstance(v, str)]
    return found


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real native run of tiny-relu.onnx in ".../My Projects/secret-project/", its text planted with every
    form, exported plain and --redact public."""
    root = tmp_path_factory.mktemp("redact")
    folder = root / "My Projects" / "secret-project"
    folder.mkdir(parents=True)
    _relu(folder / "tiny-relu.onnx")
    db = root / "My Projects" / "store.duckdb"
    done = run_cli(
        "native", "--model-path", str(folder / "tiny-relu.onnx"), "--engines", "onnxruntime", "--hardware", "cpu",
        "--batch-sizes", "1,2", "--sequence-lengths", "4", *QUICK, "--db", str(db),
        "--output-dir", str(root / "reports"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _plant(db)
    out = {"db": db, "folder": folder}
    for level in ("plain", "public"):
        out[level] = root / f"{level}.bundle"
        redact = ["--redact", "public"] if level == "public" else []
        done = run_cli("export", "--bundle", str(out[level]), *redact, "--db", str(db))
        assert done.returncode == 0, done.stderr
    return out


def _containing(texts: dict[str, list[str]], secret: str) -> list[str]:
    if secret == HOSTNAME:  # a short hostname ("vm") is looked for as a word
        pattern = re.compile(rf"(?<![\w-]){re.escape(secret)}(?![\w-])", re.IGNORECASE)
        return [where for where, cells in texts.items() if any(pattern.search(cell) for cell in cells)]
    return [where for where, cells in texts.items() if any(secret in cell for cell in cells)]


def test_redact_public_leaves_no_path_email_host_or_address_in_any_text_column(bundles: dict[str, Any]) -> None:
    plain, public = _texts(bundles["plain"]), _texts(bundles["public"])
    secrets = [*SECRETS, str(bundles["folder"]), HOSTNAME]
    assert {s: bool(_containing(plain, s)) for s in secrets} == dict.fromkeys(secrets, True)  # all were there
    assert {s: _containing(public, s) for s in secrets} == {s: [] for s in secrets}
    args = json.loads(pq.read_table(pa.BufferReader(zipfile.ZipFile(bundles["public"]).read("runs.parquet")))
                      .column("arguments")[0].as_py())  # fmt: skip
    assert args["model_path"] == "<path>" and args["db_path"] == "<path>"  # the leak as reported: '<path> Projects/…'


def test_redact_public_keeps_model_names_engines_versions_and_numbers(bundles: dict[str, Any]) -> None:
    public = _texts(bundles["public"])
    assert {k: bool(_containing(public, k)) for k in KEPT} == dict.fromkeys(KEPT, True)
    error = next(cell for cell in public["results.parquet:error"] if "bert-tiny" in cell)
    assert USEFUL in error and "Ray node <" in error


def test_a_redacted_result_keeps_its_hash_unless_a_measured_column_changed(bundles: dict[str, Any]) -> None:
    """Notes (error, details) are outside the content hash: those results keep theirs, so the plain and the
    public bundle import as one result. The result whose weights (a measured column) held a path is hashed
    again from what the bundle carries, and the public bundle imports."""
    tables = {}
    for level in ("plain", "public"):
        with zipfile.ZipFile(bundles[level]) as archive:
            tables[level] = {
                t: pq.read_table(pa.BufferReader(archive.read(f"{t}.parquet"))) for t in ("results", "samples")
            }
    hashes = {level: dict(zip(t["results"]["result_id"].to_pylist(), t["results"]["content_hash"].to_pylist(),
                              strict=True)) for level, t in tables.items()}  # fmt: skip
    changed = {rid for rid in hashes["plain"] if hashes["plain"][rid] != hashes["public"][rid]}
    weights = dict(zip(tables["public"]["results"]["result_id"].to_pylist(),
                       tables["public"]["results"]["weights"].to_pylist(), strict=True))  # fmt: skip
    assert changed == {rid for rid, source in weights.items() if source == "<path>"} and len(changed) == 1
    with duckdb.connect() as con:  # the carried hash is the one harness.store computes from the carried rows
        for name, table in tables["public"].items():
            con.register(f"incoming_{name}", table)
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM incoming_{name}")
        con.execute("UPDATE results SET content_hash = NULL")
        con.execute(hash_results_sql())
        recomputed = dict(con.execute("SELECT result_id, content_hash FROM results").fetchall())
    assert recomputed == hashes["public"]
    target = bundles["db"].parent.parent / "imported.duckdb"
    done = run_cli("import", str(bundles["public"]), "--db", str(target))
    assert done.returncode == 0, done.stderr
    with open_store(target, read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM results")[0]["n"] == len(hashes["public"])


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("cannot load /srv/My Projects/secret-project/model.onnx: no", "cannot load <path>: no"),
        ("weights /srv/data/My model.onnx here", "weights <path> here"),
        ("./x/y and x/y/z.onnx and a/b.onnx", "<path> and <path> and <path>"),
        (r"UNC \\server\share\Team Folder\m.onnx end", "UNC <path> end"),
        (r"C:\Users\Carol Smith\m.onnx end", "<path> end"),
        ("~dave and ~/x/y.onnx, ~5 ms", "<path> and <path>, ~5 ms"),
        ("file:/home/user/x.onnx", "<path>"),
        ("mail frank@example.org.", "mail <email>."),
        ("from Ray node box-7 (10.1.2.3)", "from Ray node <host> (<address>)"),
        ("node gpu-box (fe80::1%eth0)", "node <host> (<address>)"),
        ("at 2001:db8::42, ::ffff:10.0.0.1 and [::1]:80", "at <address>, <address> and [<address>]:80"),
        ("http://203.0.113.7:8080/x ok", "<address> ok"),
    ],
)
def test_each_form_is_replaced(text: str, redacted: str) -> None:
    from harness.bundle.redact import scrubber

    assert scrubber(set())(text) == redacted


def test_what_must_stay_useful_is_kept() -> None:
    """Model ids, EP and engine names, versions (three parts are not an IPv4), rates, user agent tokens."""
    from harness.bundle.redact import scrubber

    kept = ("bert-tiny on onnxruntime-web 1.31.1 WebGpuExecutionProvider 3.5 ms, pp/tg tokens/s; "
            "Qwen/Qwen2.5-0.5B onnx-community/gemma-3-1b-it Chrome/131.0.6778.85 std::vector 12:30:45")  # fmt: skip
    assert scrubber({"alice-laptop"})(kept) == kept
    assert scrubber({"alice-laptop", "vm"})("on alice-laptop.corp and VM vmx") == "on <name>.corp and <name> vmx"
