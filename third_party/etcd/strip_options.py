#!/usr/bin/env python3
"""Copies one of etcd's .proto files without its gogoproto and google.api annotations.

Debian's protobuf has neither gogoproto/gogo.proto nor google/api/annotations.proto, and
neither changes the messages or services: they only steer Go code generation and the HTTP
gateway. Removed: the two imports, every `option (gogoproto.X) = ...;` line, every
`[(gogoproto.X) = ...]` field option, and every `option (google.api.http) = { ... };` block
(braces nest, so they are matched, not patterned).

usage: strip_options.py IN.proto OUT.proto
"""
import re
import sys


def strip(text: str) -> str:
    text = re.sub(r'^\s*import\s+"(gogoproto/gogo|google/api/annotations)\.proto";\s*$', "",
                  text, flags=re.M)
    text = re.sub(r"^\s*option\s+\(gogoproto\.[^)]*\)\s*=[^;]*;\s*$", "", text, flags=re.M)
    text = re.sub(r"\s*\[\s*\(gogoproto\.[^\]]*\]", "", text)
    out, i = [], 0
    pattern = re.compile(r"option\s+\(google\.api\.http\)\s*=\s*\{")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth:
            if j >= len(text):
                sys.exit("unbalanced braces in a google.api.http option")
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        while j < len(text) and text[j] in " \t\n":
            j += 1
        if j < len(text) and text[j] == ";":
            j += 1
        i = j
    text = "".join(out)
    # An rpc whose only option went away keeps an empty body "{ }", which protoc accepts.
    if "gogoproto" in text or "google.api" in text:
        sys.exit("an annotation was left behind; the pattern needs updating")
    return text


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(strip(text))


if __name__ == "__main__":
    main()
