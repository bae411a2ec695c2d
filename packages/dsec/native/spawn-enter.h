/* dsec-spawn's `enter` request, in its forked child (spawn-enter.c). */
#ifndef DSEC_SPAWN_ENTER_H
#define DSEC_SPAWN_ENTER_H
#include "enter-core.h"
#include <stddef.h>

/*
 * Becomes the starter of one command: fds 0..nfds-1 from ends[] (-1: null_path), every other fd
 * closed (but `prepared`'s, the sandbox the helper keeps prepared, or NULL), then the enter
 * request `req` (len bytes) run as enter-core.c runs it. `title` (`room` bytes) is the helper's
 * own argv strings, where its command line is written. Never returns.
 */
void spawn_enter_child(char *req, size_t len, const int *ends, int nfds, const char *null_path, char *title, size_t room, const struct enter_sandbox *prepared);

#endif
