from __future__ import annotations

import pytest

from switchyard.cluster.topology import ClusterError, load_cluster, local_cluster, parse_cluster


def test_shipped_clusters_load(root):
    spark = load_cluster(root / "deploy/clusters/spark8.yaml")
    assert spark.fabric == "switch" and len(spark.nodes) == 8
    assert {spark.memory_of(n) for n in spark.nodes} == {128}
    ring = load_cluster(root / "deploy/clusters/ring4.yaml")
    assert ring.fabric == "ring" and [n.name for n in ring.order] == ["node-a", "node-b", "node-c", "node-d"]
    assert ring.neighbours("node-a", "node-d") and ring.neighbours("node-b", "node-c")
    assert not ring.neighbours("node-a", "node-c")
    assert ring.node("node-a").nics == ["enp1s0f0np0", "enp1s0f1np1"]


def test_ring_order_comes_from_ring_key():
    c = parse_cluster(
        "fabric: ring\nnodes:\n  - {name: a, address: 1.1.1.1}\n  - {name: b, address: 1.1.1.2}\n"
        "  - {name: c, address: 1.1.1.3}\n  - {name: d, address: 1.1.1.4}\nring: [a, c, b, d]\n"
    )
    assert [n.name for n in c.order] == ["a", "c", "b", "d"]
    assert c.neighbours("a", "c") and c.neighbours("d", "a") and not c.neighbours("a", "b")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("fabric: switch\nnodes:\n  - {name: a, address: x}\n  - {name: a, address: y}\n", 1, "listed twice"),
        ("fabric: switch\nnodes:\n  - {name: a, address: x}\n  - {name: b, address: x}\n", 1, "address"),
        ("fabric: mesh\nnodes:\n  - {name: a, address: x}\n", 1, "fabric"),
        ("fabric: switch\nnodes:\n  - {name: a, address: x, memroy_gb: 3}\n", 3, "unknown key 'memroy_gb'"),
        ("fabric: switch\nnodes:\n  - {name: a, address: x}\nring: [a]\n", 1, "needs `fabric: ring`"),
        ("fabric: ring\nnodes:\n  - {name: a, address: x}\n  - {name: b, address: y}\nring: [a, c]\n", 1,
         "missing ['b']; unknown ['c']"),
        ("fabric: ring\nnodes:\n  - {name: a, address: x}\n", 1, "at least 2 nodes"),
        ("fabric: switch\nnodes: []\n", 2, "nodes"),
        ("fabric: switch\nnodes:\n  - {name: 'a b', address: x}\n", 3, "node name"),
        ("- just a list\n", 1, "mapping"),
        ("fabric: [\n", 2, "YAML syntax"),
    ],
)
def test_cluster_errors_name_line_and_reason(text, line, words):
    with pytest.raises(ClusterError) as e:
        parse_cluster(text, "c.yaml")
    msg = str(e.value)
    assert msg.startswith(f"c.yaml:{line}:"), msg
    assert words in msg


def test_missing_file_is_a_cluster_error(tmp_path):
    with pytest.raises(ClusterError, match="cannot read"):
        load_cluster(tmp_path / "nope.yaml")


def test_local_cluster_is_one_shared_node():
    c = local_cluster()
    assert [n.address for n in c.nodes] == ["127.0.0.1"] and c.share_nodes and c.fabric == "switch"
