/* The sandboxes dsec-spawn keeps prepared for `enter` requests (spawn-sandboxes.c). */
#ifndef DSEC_SPAWN_SANDBOXES_H
#define DSEC_SPAWN_SANDBOXES_H
#include "enter-core.h"
#include <poll.h>

/* At most this many kept at once (fewer where the fd limit is lower). */
#define SPAWN_MAX_SANDBOXES 4096

/*
 * The prepared sandbox of an enter request whose options (dsec-enter's `--flag value` pairs, up
 * to the `--`) are options[0..count): kept from an earlier command, or prepared now. NULL when
 * it cannot be (a malformed request, an init that is gone, no room): the starter prepares it
 * itself then, and says why it cannot. Valid until the next call.
 */
const struct enter_sandbox *spawn_sandbox_for(char **options, int count);

/* Fills pfd with one entry per kept sandbox (its init's pidfd); returns how many (at most max). */
int spawn_sandboxes_poll(struct pollfd *pfd, int max);

/* Drops the kept sandboxes whose init has exited (their pidfd polled readable in pfd[0..n)). */
void spawn_sandboxes_ended(const struct pollfd *pfd, int n);

/* The fds a prepared sandbox holds (a starter keeps them when it closes the rest); returns how many. */
int spawn_sandbox_fds(const struct enter_sandbox *s, int *fds, int max);

#endif
