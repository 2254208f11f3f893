#!/usr/bin/python3
"""Every proof named in docs/claims.md exists (issue 33): each `test: NAME` is a test CTest
knows (NAME may end in * for a parameterised family, matching at least one), each
`bench/NAME` a benchmark script in bench/ (executable) and each `script: PATH` a file of the
repository. A row without any proof must say "not proven".

Coverage: README.md and every docs/*.md but claims.md itself is named (its stem, e.g.
"planner" or "planner.md") in some row's "where" column or a "## " heading, or listed on the
line "No quantitative claims: docs/a.md, docs/b.md." -- so a new doc without rows fails.

usage: check_claims.py CLAIMS_MD SOURCE_DIR CTEST_BINARY BUILD_DIR   (exit 0: all found)
"""
import fnmatch
import os
import re
import subprocess
import sys


def ctest_names(ctest, build):
    out = subprocess.run([ctest, "-N"], cwd=build, capture_output=True, text=True, check=True)
    # "  Test #12: TpMemory.OneLayerFollowsKorthikanti"
    return [m.group(1) for m in re.finditer(r"Test\s+#\d+: (\S+)", out.stdout)]


def doc_files(src):
    docs = os.path.join(src, "docs")
    names = ["README.md"] + sorted("docs/" + f for f in os.listdir(docs)
                                   if f.endswith(".md") and os.path.isfile(os.path.join(docs, f)))
    return [n for n in names if n != "docs/claims.md"]


def names_doc(text, doc):
    """text names doc by its stem: "planner" or "planner.md", not "cuda" for cuda-device-session."""
    stem = os.path.splitext(os.path.basename(doc))[0]
    return re.search(r"(?<![\w-])" + re.escape(stem) + r"(\.md)?(?![\w-])", text) is not None


def coverage(claims, src, wheres, headings, exempt_line):
    bad = []
    exempt = re.findall(r"[A-Za-z0-9_./-]+\.md", exempt_line)
    for e in exempt:
        if not os.path.isfile(os.path.join(src, e)):
            bad.append(f"{claims}: 'No quantitative claims' names {e}, which does not exist")
    for doc in doc_files(src):
        if doc in exempt:
            continue
        if not any(names_doc(t, doc) for t in wheres + headings):
            bad.append(f"{claims}: {doc} is named in no row's 'where' column or heading: add its "
                       "claims, or list it on the 'No quantitative claims:' line")
    return bad


def main():
    claims, src, ctest, build = sys.argv[1:5]
    names = ctest_names(ctest, build)
    if not names:
        sys.exit(f"ctest -N in {build} lists no tests")
    rows, bad = 0, []
    wheres, headings, exempt_line = [], [], ""
    for lineno, line in enumerate(open(claims, encoding="utf-8"), 1):
        if line.startswith("## "):
            headings.append(line[3:])
        if line.startswith("No quantitative claims:"):
            exempt_line = line
        if not line.startswith("|") or line.startswith("| ---") or line.startswith("| claim"):
            continue
        # "\|" inside a cell is no border
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) < 3:
            bad.append(f"{claims}:{lineno}: fewer than 3 columns")
            continue
        rows += 1
        wheres.append(cells[1])
        proof = cells[2]
        tests = re.findall(r"test: ([A-Za-z0-9_./*-]+)", proof)
        benches = re.findall(r"`(bench/[A-Za-z0-9_./-]+)`", proof)
        scripts = re.findall(r"script: ([A-Za-z0-9_./-]+)", proof)
        if not (tests or benches or scripts) and "not proven" not in proof:
            bad.append(f"{claims}:{lineno}: names no test, benchmark or script and does not say "
                       "'not proven'")
        for t in tests:
            if not any(fnmatch.fnmatchcase(n, t) for n in names):
                bad.append(f"{claims}:{lineno}: no CTest test matches '{t}'")
        for b in benches:
            p = os.path.join(src, b)
            if not (os.path.isfile(p) and os.access(p, os.X_OK)):
                bad.append(f"{claims}:{lineno}: no executable benchmark script {b}")
        for s in scripts:
            if not os.path.isfile(os.path.join(src, s)):
                bad.append(f"{claims}:{lineno}: no file {s}")
    if rows == 0:
        bad.append(f"{claims}: no rows")
    bad += coverage(claims, src, wheres, headings, exempt_line)
    for b in bad:
        print(b)
    print(f"{rows} claims checked against {len(names)} CTest tests: "
          f"{'all proofs found' if not bad else str(len(bad)) + ' problems'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
