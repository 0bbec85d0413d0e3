#!/usr/bin/env python3
"""Counts test cases in JUnit XML reports (Bazel's test.xml, pytest's junitxml).

Prints one line "N passed, N failed, N skipped" and exits 1 when anything failed or a
test target produced no report (failed to build, crashed before writing XML).
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def count(root: pathlib.Path):
    passed = failed = skipped = 0
    for unbuilt in root.rglob("unbuilt.txt"):
        failed += len([l for l in unbuilt.read_text().splitlines() if l.strip()])
    for missing in root.rglob("*.missing"):
        failed += 1
    for xml in sorted(root.rglob("*.xml")):
        try:
            tree = ET.parse(xml)
        except ET.ParseError as e:
            print(f"unreadable test report {xml}: {e}", file=sys.stderr)
            failed += 1
            continue
        cases = list(tree.iter("testcase"))
        if not cases:
            # A target whose runner wrote no cases (e.g. a shell test): judge the suite.
            suites = list(tree.iter("testsuite"))
            bad = any(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
            failed += 1 if bad else 0
            passed += 0 if bad else 1
            continue
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped" \
                    or case.get("status") == "notrun":
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main():
    root = pathlib.Path(sys.argv[1])
    passed, failed, skipped = count(root)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
