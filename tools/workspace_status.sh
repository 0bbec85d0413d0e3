#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): the git revision the tree was built from,
# which //base:build_info stamps into every program (--version, gcomp_build_info). Outside a
# git checkout the revision is "unknown"; uncommitted changes to tracked files add "-dirty".
rev=$(git rev-parse --short=12 HEAD 2>/dev/null) || rev=unknown
if [ "$rev" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  rev="$rev-dirty"
fi
echo "STABLE_GCOMP_REVISION $rev"
