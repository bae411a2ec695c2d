#!/usr/bin/env python3
"""Copies packages/dsec/native (of the final code of this branch) to OUT with timestamps at each
step of an enter request (trace.h: CLOCK_MONOTONIC into shared memory, flushed to
/tmp/x32/trace.txt by dsec-spawn at each answer). Build: gcc -O2 -o OUT/dsec-spawn-trace
OUT/spawn-helper.c OUT/spawn-enter.c OUT/spawn-sandboxes.c OUT/enter-core.c OUT/landlock-domain.c
(the code before this branch: the same anchors but `if (setns(pidfd, flags)` and enter_run's
three-argument signature, and no spawn-sandboxes.c). usage: apply-trace.py NATIVE_DIR OUT"""
import shutil, sys, os
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in os.listdir(src):
    if f.endswith(('.c', '.h')): shutil.copy(os.path.join(src, f), out)
shutil.copy(os.path.join(os.path.dirname(__file__), 'trace.h'), out)
def rep(s, a, b):
    assert a in s, a
    return s.replace(a, b, 1)
p = os.path.join(out, 'spawn-helper.c'); s = open(p).read()
s = rep(s, '#include "spawn-enter.h"', '#include "spawn-enter.h"\n#include "trace.h"\nstruct trace_shm *trace_shm;')
s = rep(s, '    if (strcmp(stdio, "stream") == 0 || strcmp(stdio, "enter") == 0) start_stream', '    if (stdio[0]==\'e\') TRACE("S0_request");\n    if (strcmp(stdio, "stream") == 0 || strcmp(stdio, "enter") == 0) start_stream')
s = rep(s, '  write_all(head, (size_t)n);\n}\n\n/*\n * The template', '  write_all(head, (size_t)n);\n  if (enter) TRACE("S1_started_written");\n}\n\n/*\n * The template')
s = rep(s, '    if (pid == 0) {\n      if (strcmp(oom, "-") != 0 && set_oom', '    if (pid == 0) {\n      TRACE("C0_child");\n      if (strcmp(oom, "-") != 0 && set_oom')
s = rep(s, '      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {', '      TRACE("S2_sigchld");\n      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {')
s = rep(s, '      answer(c->id, c->status, &none, &none);\n      c->answered = 1;', '      answer(c->id, c->status, &none, &none);\n      c->answered = 1;\n      TRACE("S3_answered"); TRACE_FLUSH();')
s = rep(s, '    close_held(c);\n    c->released = 1;', '    close_held(c);\n    c->released = 1;\n    TRACE("S_release");')
s = rep(s, '  read_own_oom_score_adj();\n', '  read_own_oom_score_adj();\n  TRACE("S_start");\n')
open(p, 'w').write(s)
p = os.path.join(out, 'enter-core.c'); e = open(p).read()
e = rep(e, '#include "landlock-domain.h"', '#include "landlock-domain.h"\n#include "trace.h"')
e = rep(e, 'int enter_run(const struct enter_options *o, char **args, char **env, const struct enter_sandbox *prepared) {', 'int enter_run(const struct enter_options *o, char **args, char **env, const struct enter_sandbox *prepared) {\n  TRACE("C1_enter_run");')
e = rep(e, '  if (setns(s->pidfd, s->flags) != 0)', '  TRACE("C2_before_setns");\n  if (setns(s->pidfd, s->flags) != 0)')
e = rep(e, '  pid_t child = fork();\n  if (child < 0) die("fork", NULL);', '  TRACE("C3_after_setns");\n  pid_t child = fork();\n  if (child < 0) die("fork", NULL);')
e = rep(e, '    close(go[0]);\n    become_command(', '    close(go[0]);\n    TRACE("G0_released");\n    become_command(')
e = rep(e, '  close(go[0]);\n  char text[32];', '  close(go[0]);\n  TRACE("C4_forked");\n  char text[32];')
e = rep(e, '  if (write(go[1], "1", 1) != 1) die("releasing the command", NULL);', '  TRACE("C5_cgroups_written");\n  if (write(go[1], "1", 1) != 1) die("releasing the command", NULL);')
e = rep(e, '  int status;\n  while (waitpid(child, &status, 0) < 0) {\n    if (errno != EINTR) die("waitpid", NULL);\n  }', '  int status;\n  while (waitpid(child, &status, 0) < 0) {\n    if (errno != EINTR) die("waitpid", NULL);\n  }\n  TRACE("C6_waited");')
e = rep(e, '  if (o->landlock != ENTER_LANDLOCK_NONE) {\n    char why[512];', '  TRACE("G1_creds_done");\n  if (o->landlock != ENTER_LANDLOCK_NONE) {\n    char why[512];')
e = rep(e, '  environ = env;\n  /* Last:', '  TRACE("G2_landlock_done");\n  environ = env;\n  /* Last:')
e = rep(e, '  execvp(args[0], args);\n  /* As a shell', '  TRACE("G3_seccomp_done");\n  execvp(args[0], args);\n  /* As a shell')
open(p, 'w').write(e)
