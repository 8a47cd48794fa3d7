#!/usr/bin/env python3
"""Collects the licence notices of every crate a program links, for its image.

    images/notices.py PROGRAM OUTDIR

Writes OUTDIR/INDEX.tsv (crate, version, licence, repository) and copies each
crate's LICENSE*/COPYING*/NOTICE* files into OUTDIR/<crate>-<version>/: MIT, BSD
and Apache-2.0 ask that their notices travel with binaries. Reads `cargo metadata
--offline` for the host target, normal dependencies only (what is linked).
"""
import json
import os
import re
import shutil
import subprocess
import sys

NOTICE = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|COPYRIGHT|UNLICENSE)", re.I)


def main(program, outdir):
    cargo = os.environ.get("CARGO", "cargo")
    host = re.search(r"^host: (\S+)", subprocess.check_output(["rustc", "-vV"], text=True), re.M)
    md = json.loads(subprocess.check_output(
        [cargo, "metadata", "--format-version", "1", "--offline",
         "--filter-platform", host.group(1)]))
    pkgs = {p["id"]: p for p in md["packages"]}
    nodes = {n["id"]: n for n in md["resolve"]["nodes"]}
    members = set(md["workspace_members"])
    start = next(i for i in members if pkgs[i]["name"] == program)
    seen, stack = set(), [start]
    while stack:
        for d in nodes[stack.pop()]["deps"]:
            if any(k["kind"] is None for k in d["dep_kinds"]) and d["pkg"] not in seen:
                seen.add(d["pkg"])
                stack.append(d["pkg"])
    os.makedirs(outdir, exist_ok=True)
    rows = []
    for pid in sorted(seen, key=lambda i: (pkgs[i]["name"], pkgs[i]["version"])):
        p = pkgs[pid]
        if pid in members:
            continue  # ringlb's own crates: /usr/share/doc/ringlb/LICENSE*
        src = os.path.dirname(p["manifest_path"])
        dst = os.path.join(outdir, f'{p["name"]}-{p["version"]}')
        os.makedirs(dst, exist_ok=True)
        for f in sorted(os.listdir(src)):
            if NOTICE.match(f) and os.path.isfile(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), dst)
        if not os.listdir(dst):
            with open(os.path.join(dst, "NO-LICENSE-FILE"), "w") as f:
                f.write(f'{p["name"]} {p["version"]} ships no licence file; its Cargo.toml says '
                        f'`{p["license"]}`. Apache-2.0 text: /usr/share/doc/ringlb/LICENSE.\n')
        lic = p["license"] or f'see {p.get("license_file") or "its files"}'
        rows.append(f'{p["name"]}\t{p["version"]}\t{lic}\t{p.get("repository") or ""}')
    with open(os.path.join(outdir, "INDEX.tsv"), "w") as f:
        f.write("crate\tversion\tlicence\trepository\n" + "\n".join(rows) + "\n")
    print(f"notices: {program}: {len(rows)} crates -> {outdir}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
