#!/usr/bin/env python3
"""The plan-search tables of docs/results.md ("Overlap-aware plan search"), from `concerto plan`.

  scripts/plan_tables.py overlap   [--time-budget S]  # item 3: overlap-aware vs additive first choice
  scripts/plan_tables.py published [--time-budget S] [--only ID ...]  # item 4: vs the plans experts chose

Prints markdown tables; progress on stderr. Needs build/concerto (make build).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "concerto")
TABLE = os.path.join(ROOT, "examples", "validation", "published.yaml")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def concerto(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"concerto {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def plan_search(model, cluster, nodes, batch, extra):
    args = ["plan", "--model", model, "--cluster", cluster, "--global-batch", str(batch), "--json", *extra]
    if nodes:
        args += ["--nodes", str(nodes)]
    return concerto(*args)


def label(row):
    return f"{row['plan']}, mbs={row['micro_batch']}" if row else "-"


# ---- item 3 ----
WORKLOADS = [  # (name, model, cluster, nodes, global batch)
    ("dense GPT on commodity PCIe + 25 GbE", "gpt-6.7b", "commodity-4x8", 0, 64),
    ("LLaMA on the A800 testbed", "llama-7b", "a800-4x8", 0, 64),
    ("MoE on the A800 testbed", "mixtral-8x7b", "a800-4x8", 0, 32),
]


def overlap_table(budget):
    out = ["| workload | overlap-aware first plan | step ms | additive first plan | its step ms | ratio | "
           "additive's own ranking step ms | plans (evaluated) | search s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, model, cluster, nodes, batch in WORKLOADS:
        common = ["--time-budget", str(budget), "--top", "1"]
        log(f"{name}: overlap-aware search")
        aware = plan_search(model, cluster, nodes, batch, common)
        log(f"{name}: additive search")
        blind = plan_search(model, cluster, nodes, batch, common + ["--objective", "additive"])
        a, b = aware["ranked"][0], blind["ranked"][0]
        # The additive search's first plan, judged as the overlap search judges every plan: its best
        # simulated step (its own baseline, and concerto: the additive run searched it too).
        ratio = b["step_us"] / a["step_us"]
        out.append(f"| {name}: {model} on {cluster}, batch {batch} | {label(a)} | {a['step_us'] / 1e3:.1f} | "
                   f"{label(b)} | {b['step_us'] / 1e3:.1f} | {ratio:.3f}x | {b['additive_step_us'] / 1e3:.1f} | "
                   f"{aware['plans']} ({aware['fates'].get('evaluated', 0)}) | "
                   f"{aware['search_s']:.0f} + {blind['search_s']:.0f} |")
    return "\n".join(out)


# ---- item 4 ----
def natural_baseline(plan):
    keys = dict(kv.split("=") if "=" in kv else (kv, "1") for kv in plan.split(","))
    if int(keys.get("zero", 0)) > 0:
        return "zero"
    if int(keys.get("tp", 1)) > 1 or int(keys.get("pp", 1)) > 1 or int(keys.get("ep", 1)) > 1:
        return "megatron"
    return "ddp"


def published_table(budget, only):
    rows = [r for r in yaml.safe_load(open(TABLE))["rows"] if r.get("kind") == "training" and r.get("plan")]
    if only:
        rows = [r for r in rows if r["id"] in only]
    out = ["| row | GPUs | published plan | its step ms (baseline) | search's first plan | step ms | ratio | "
           "plans (evaluated) | search s | complete |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    bugs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            try:
                line = published_row(r, tmp, budget, bugs)
            except SystemExit as e:  # a failing command: the row says so, the table goes on
                line = f"| {r['id']} | - | {r['plan']} | error: {str(e).splitlines()[-1][:120]} | - | - | - | - | - | - |"
            log(line)
            out.append(line)
    text = "\n".join(out)
    if bugs:
        text += "\n\nSEARCH BUG: the published plan beat the search's first choice:\n" + "\n".join(bugs)
    return text


def published_row(r, tmp, budget, bugs):
    if True:
        if True:
            model = yaml.safe_load(open(os.path.join(ROOT, "examples", "validation", r["model"])))
            model["batch"] = int(r["micro_batch"])
            path = os.path.join(tmp, r["id"] + ".yaml")
            yaml.safe_dump(model, open(path, "w"))
            keys = dict(kv.split("=") if "=" in kv else (kv, "1") for kv in r["plan"].split(","))
            nodes = int(r.get("nodes", 0))
            sched = natural_baseline(r["plan"])
            lowered = os.path.join(tmp, r["id"] + ".json")
            concerto("lower", "--model", path, "--plan", r["plan"], "-o", lowered, "--json")
            sim = concerto("simulate", lowered, "--cluster", r["cluster"], "--nodes", str(nodes), "--scheduler",
                           sched, "--json")
            os.remove(lowered)
            log(f"{r['id']}: published plan {r['plan']} {sched} {sim['makespan_us'] / 1e3:.1f} ms; searching")
            extra = ["--time-budget", str(budget), "--search-top", "0", "--top", "1", "--all-micro-batch-sizes",
                     "--zero-with-pp", "--max-micro-batch", str(max(8, int(r["micro_batch"]))),
                     "--max-vstages", str(max(4, int(keys.get("vstages", 1))))]
            found = plan_search(path, r["cluster"], nodes, r["global_batch"], extra)
            first = found["ranked"][0] if found["ranked"] else None
            pub = sim["makespan_us"] if sim["fits_memory"] else None
            complete = "yes" if not found["time_budget_hit"] else (
                f"no: rest >= {found['unexplored_bound_us'] / 1e3:.0f} ms" if first
                else "no")
            ratio = f"{pub / first['step_us']:.3f}x" if (pub and first) else "-"
            if pub and first and pub < first["step_us"] * (1 - 1e-9) and not found["time_budget_hit"]:
                bugs.append(f"{r['id']}: published {pub:.1f} us < search's first {first['step_us']:.1f} us")
            pub_txt = f"{pub / 1e3:.1f} ({sched})" if pub else f"over memory ({sim['peak_memory_bytes'] / 1e9:.1f} GB)"
            return (f"| {r['id']} | {found['devices']} | {r['plan']}, mbs={r['micro_batch']} | {pub_txt} | "
                    f"{label(first)} | {first['step_us'] / 1e3:.1f} | {ratio} | "
                    f"{found['plans']} ({found['fates'].get('evaluated', 0)}) | {found['search_s']:.0f} | "
                    f"{complete} |" if first else f"| {r['id']} | {found['devices']} | {r['plan']} | {pub_txt} | "
                    f"{'none found in the budget' if found['time_budget_hit'] else 'none fits'} | - | - | {found['plans']} | {found['search_s']:.0f} | {complete} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", choices=["overlap", "published"])
    ap.add_argument("--time-budget", type=float, default=300, help="per search, seconds (default 300)")
    ap.add_argument("--only", nargs="*", default=[], help="published: these row ids only")
    a = ap.parse_args()
    print(overlap_table(a.time_budget) if a.table == "overlap" else published_table(a.time_budget, a.only))


if __name__ == "__main__":
    main()
