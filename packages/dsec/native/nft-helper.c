/*
 * dsec-nft: applies nftables rulesets in sandboxes' network namespaces for one edge, resident.
 *
 * The edge starts one per node and keeps it; it never forks. Each request on stdin is
 *
 *   <pid> <length>\n<length bytes of nft commands>
 *
 * pid 0 means this process's own (the host's) network namespace. The helper moves into
 * /proc/<pid>/ns/net with setns(2), runs the commands through libnftables (nftables' own library,
 * one atomic transaction, exactly what `nft -f` does), moves back, and answers on stdout
 *
 *   ok <length>\n<nft's output>      or      err <length>\n<nft's error text>
 *
 * Why a process of its own rather than libnftables inside the edge: a transaction committed by a
 * process that has just forked waits 10–40 ms in the kernel (measured here: 0.5 ms otherwise),
 * and the edge forks all the time (every crun). This helper never forks, so a policy switch costs
 * about a millisecond whatever the edge is doing. It is single-threaded, so setns(2) has no
 * other thread to surprise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* libnftables' API (stable since 0.9; declared here so that no -dev package is needed). */
struct nft_ctx;
extern struct nft_ctx *nft_ctx_new(uint32_t flags);
extern void nft_ctx_free(struct nft_ctx *ctx);
extern int nft_ctx_buffer_output(struct nft_ctx *ctx);
extern int nft_ctx_buffer_error(struct nft_ctx *ctx);
extern const char *nft_ctx_get_output_buffer(struct nft_ctx *ctx);
extern const char *nft_ctx_get_error_buffer(struct nft_ctx *ctx);
extern int nft_run_cmd_from_buffer(struct nft_ctx *ctx, const char *buf);

#define MAX_REQUEST (16 << 20)

static void answer(const char *status, const char *text) {
  size_t n = text ? strlen(text) : 0;
  printf("%s %zu\n", status, n);
  if (n) fwrite(text, 1, n, stdout);
  fflush(stdout);
}

/* Runs `commands` in this process's current netns; answers. */
static void run_here(const char *commands) {
  struct nft_ctx *ctx = nft_ctx_new(0);
  if (!ctx) {
    answer("err", "nft_ctx_new failed");
    return;
  }
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  if (nft_run_cmd_from_buffer(ctx, commands) == 0)
    answer("ok", nft_ctx_get_output_buffer(ctx));
  else
    answer("err", nft_ctx_get_error_buffer(ctx));
  nft_ctx_free(ctx);
}

int main(void) {
  int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) {
    perror("dsec-nft: open /proc/self/ns/net");
    return 1;
  }
  long pid;
  size_t len;
  while (scanf("%ld %zu", &pid, &len) == 2) {
    if (getchar() != '\n' || len > MAX_REQUEST) {
      fprintf(stderr, "dsec-nft: malformed request\n");
      return 1;
    }
    char *buf = malloc(len + 1);
    if (!buf || fread(buf, 1, len, stdin) != len) {
      fprintf(stderr, "dsec-nft: short request\n");
      return 1;
    }
    buf[len] = '\0';
    if (pid == 0) {
      run_here(buf);
    } else {
      char path[64];
      snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
      int target = open(path, O_RDONLY | O_CLOEXEC);
      if (target < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "cannot open %s: %s", path, strerror(errno));
        answer("err", msg);
      } else if (setns(target, CLONE_NEWNET) != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "setns into %s: %s", path, strerror(errno));
        answer("err", msg);
        close(target);
      } else {
        close(target);
        run_here(buf);
        /* Back home before anything else; if that fails, stop rather than serve the wrong netns. */
        if (setns(home, CLONE_NEWNET) != 0) {
          perror("dsec-nft: setns back to the host netns");
          return 1;
        }
      }
    }
    free(buf);
  }
  return 0;
}
