/*
 * The Landlock domain a command starts in (landlock-domain.c), shared by dsec-landlock
 * (landlock-exec.c, inside the sandbox) and the command starter of dsec-spawn and dsec-enter
 * (enter-core.c, which applies it in the command's own process before its one exec).
 */
#ifndef DSEC_LANDLOCK_DOMAIN_H
#define DSEC_LANDLOCK_DOMAIN_H
#include <stddef.h>

/*
 * Puts this process in a Landlock domain of its own: with `isolate`, one that changes no file
 * right that matters; otherwise one where files may change only beneath each of rw[0..nrw-1]
 * (and /dev's standard nodes and dirs). Sets no_new_privs (Landlock needs it). Fails closed: on
 * -1 `why` says what failed and the caller must not run the command.
 */
int landlock_domain(int isolate, char *const *rw, int nrw, char *why, size_t why_size);

#endif
