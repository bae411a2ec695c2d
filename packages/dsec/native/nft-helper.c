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
 * It also gives a sandbox its link to the host, over rtnetlink (libmnl) rather than `ip` and
 * `nsenter` spawns (tens of ms each on a loaded host):
 *
 *   link <pid> <host-veth> <host-address> <sandbox-address> <prefix-length>\n
 *
 * makes a veth pair whose host end is <host-veth> (IPv6 off, <host-address>/<prefix>, up) and
 * whose other end is born inside /proc/<pid>/ns/net as eth0 (<sandbox-address>/<prefix>, up,
 * default route via <host-address>). Answered like the nft requests; on failure the pair is
 * deleted again, so nothing half-made is left.
 *
 * Why a process of its own rather than libnftables inside the edge: a transaction committed by a
 * process that has just forked waits 10–40 ms in the kernel (measured here: 0.5 ms otherwise),
 * and the edge forks all the time (every crun). This helper never forks, so a policy switch costs
 * about a millisecond whatever the edge is doing. Every request runs on the main thread, so
 * setns(2) (which moves only the calling thread) has no other thread to surprise.
 *
 * One libnftables context is kept per network namespace (its netlink socket speaks for the netns
 * it was made in), not made and freed per request: closing the socket of a context whose
 * transaction deleted anything (every policy switch replaces the table) waits in the kernel for
 * that transaction's deferred destroy work, an RCU grace period, holding the netns's nftables
 * commit lock: 10-15 ms measured here, so back-to-back switches cost 12 ms each instead of half a
 * millisecond. A context goes when the edge says `forget <pid>` (a sandbox's teardown), when its
 * namespace no longer belongs to the process it was asked for (checked at each request), or
 * when 64 are kept (the least recently used); its socket is then closed by the one other thread,
 * which does nothing else, so that wait is no request's. While a context is kept its socket holds
 * the namespace.
 *
 *   forget <pid>\n                  answered `ok 0`
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

#include <dirent.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>

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

/* ---- libnftables contexts, one per network namespace ---- */

/* The write end of the closer thread's pipe: sockets whose close may wait in the kernel. */
static int closer_pipe = -1;

static void *closer(void *arg) {
  int fd = (int)(intptr_t)arg, sock;
  while (read(fd, &sock, sizeof sock) == sizeof sock) close(sock);
  return NULL;
}

static void start_closer(void) {
  int p[2];
  pthread_t t;
  if (pipe2(p, O_CLOEXEC) != 0) return;
  if (pthread_create(&t, NULL, closer, (void *)(intptr_t)p[0]) != 0) {
    close(p[0]);
    close(p[1]);
    return;
  }
  pthread_detach(t);
  closer_pipe = p[1];
}

/* The netfilter netlink sockets this process holds, as fd numbers (at most `max`). */
static int netfilter_sockets(int *fds, int max) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  struct dirent *e;
  while (n < max && (e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name), proto = 0, domain = 0;
    socklen_t len = sizeof domain;
    if (fd <= 2 || fd == dirfd(d)) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_NETLINK) continue;
    len = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 && proto == NETLINK_NETFILTER) fds[n++] = fd;
  }
  closedir(d);
  return n;
}

struct kept {
  struct nft_ctx *ctx; /* NULL: a free slot */
  dev_t dev;
  ino_t ino;       /* the netns */
  long pid;        /* the process it was asked for (0: the host's) */
  int sock;        /* the context's netfilter socket, -1 when unknown */
  unsigned long used;
};
#define MAX_KEPT 64
static struct kept kept[MAX_KEPT];
static unsigned long uses;

/*
 * Frees a kept context. Its socket is duplicated first, so that the context's own close only
 * drops a reference, and the duplicate goes to the closer thread, whose close is the last.
 */
static void drop(struct kept *k) {
  int dup = -1;
  if (k->sock >= 0 && closer_pipe >= 0) dup = fcntl(k->sock, F_DUPFD_CLOEXEC, 0);
  nft_ctx_free(k->ctx);
  if (dup >= 0 && write(closer_pipe, &dup, sizeof dup) != sizeof dup) close(dup);
  k->ctx = NULL;
}

/* Whether process `pid` (0: this one) still has the network namespace a context was made for. */
static int still_there(const struct kept *k) {
  char path[64];
  struct stat st;
  if (k->pid == 0) return 1;
  snprintf(path, sizeof path, "/proc/%ld/ns/net", k->pid);
  return stat(path, &st) == 0 && st.st_dev == k->dev && st.st_ino == k->ino;
}

/* Drops the contexts whose namespace's process is gone (or is another netns's now). */
static void sweep(void) {
  for (int i = 0; i < MAX_KEPT; i++)
    if (kept[i].ctx && !still_there(&kept[i])) drop(&kept[i]);
}

/* The context for the netns this thread is in now (`st`), made if there is none. */
static struct nft_ctx *context_for(const struct stat *st, long pid) {
  struct kept *slot = NULL, *oldest = NULL;
  for (int i = 0; i < MAX_KEPT; i++) {
    struct kept *k = &kept[i];
    if (k->ctx && k->dev == st->st_dev && k->ino == st->st_ino) {
      k->used = ++uses;
      k->pid = pid;
      return k->ctx;
    }
    if (!k->ctx && !slot) slot = k;
    if (k->ctx && (!oldest || k->used < oldest->used)) oldest = k;
  }
  if (!slot) {
    drop(oldest);
    slot = oldest;
  }
  int before[16], after[16];
  int nb = netfilter_sockets(before, 16);
  struct nft_ctx *ctx = nft_ctx_new(0);
  if (!ctx) return NULL;
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  /* Its socket: the netfilter one that was not there before (libnftables opens it now). */
  int na = netfilter_sockets(after, 16), sock = -1;
  for (int a = 0; a < na && sock < 0; a++) {
    int seen = 0;
    for (int b = 0; b < nb; b++) seen |= after[a] == before[b];
    if (!seen) sock = after[a];
  }
  *slot = (struct kept){.ctx = ctx, .dev = st->st_dev, .ino = st->st_ino, .pid = pid, .sock = sock, .used = ++uses};
  return ctx;
}

/* `forget <pid>`: the sandbox is going; its context (and with it its hold on the netns) goes now. */
static void forget(long pid) {
  char path[64];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
  int known = pid > 0 && stat(path, &st) == 0;
  for (int i = 0; i < MAX_KEPT; i++) {
    struct kept *k = &kept[i];
    if (k->ctx && k->pid != 0 && (k->pid == pid || (known && k->dev == st.st_dev && k->ino == st.st_ino))) drop(k);
  }
  answer("ok", "");
}

/* Runs `commands` in this thread's current netns (`pid`'s; 0: the host's) with its kept context; answers. */
static void run_here(long pid, const char *commands) {
  struct stat st;
  if (stat("/proc/thread-self/ns/net", &st) != 0) {
    answer("err", "cannot stat this thread's netns");
    return;
  }
  struct nft_ctx *ctx = context_for(&st, pid);
  if (!ctx) {
    answer("err", "nft_ctx_new failed");
    return;
  }
  if (nft_run_cmd_from_buffer(ctx, commands) == 0)
    answer("ok", nft_ctx_get_output_buffer(ctx));
  else
    answer("err", nft_ctx_get_error_buffer(ctx));
}

/* ---- rtnetlink: a sandbox's veth link ---- */

static unsigned nl_seq;

/* Sends one request on `nl` and waits for its acknowledgement; 0, or -1 with errno set. */
static int nl_talk(struct mnl_socket *nl, struct nlmsghdr *nlh) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  nlh->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
  nlh->nlmsg_seq = ++nl_seq;
  if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) return -1;
  for (;;) {
    int n = mnl_socket_recvfrom(nl, buf, sizeof buf);
    if (n < 0) return -1;
    int rc = mnl_cb_run(buf, (size_t)n, nl_seq, mnl_socket_get_portid(nl), NULL, NULL);
    if (rc <= MNL_CB_STOP) return rc < 0 ? -1 : 0; /* the ack (or the error, errno set) */
  }
}

static struct mnl_socket *nl_open(void) {
  struct mnl_socket *nl = mnl_socket_open(NETLINK_ROUTE);
  if (nl && mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    mnl_socket_close(nl);
    return NULL;
  }
  return nl;
}

/* Sets a link up. */
static int nl_link_up(struct mnl_socket *nl, int index) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWLINK;
  struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof *ifm);
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = index;
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  return nl_talk(nl, nlh);
}

static int nl_addr_add(struct mnl_socket *nl, int index, struct in_addr addr, unsigned prefix) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWADDR;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
  struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof *ifa);
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = (unsigned char)prefix;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = (unsigned)index;
  mnl_attr_put(nlh, IFA_LOCAL, sizeof addr, &addr);
  mnl_attr_put(nlh, IFA_ADDRESS, sizeof addr, &addr);
  return nl_talk(nl, nlh);
}

static int nl_default_route(struct mnl_socket *nl, int index, struct in_addr gateway) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWROUTE;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
  struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof *rtm);
  rtm->rtm_family = AF_INET;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  mnl_attr_put(nlh, RTA_GATEWAY, sizeof gateway, &gateway);
  mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)index);
  return nl_talk(nl, nlh);
}

/* A veth pair: `host` here, its peer created as eth0 directly in the netns `netns_fd`. */
static int nl_veth_add(struct mnl_socket *nl, const char *host, int netns_fd) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWLINK;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
  struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof *ifm);
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, host);
  struct nlattr *linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  struct nlattr *data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  struct nlattr *peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  struct ifinfomsg *pifm = mnl_nlmsg_put_extra_header(nlh, sizeof *pifm);
  pifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, "eth0");
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)netns_fd);
  mnl_attr_nest_end(nlh, peer);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, linkinfo);
  return nl_talk(nl, nlh);
}

static int nl_link_del(struct mnl_socket *nl, const char *name) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_DELLINK;
  struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof *ifm);
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
  return nl_talk(nl, nlh);
}

static int disable_ipv6(const char *ifname) {
  char path[96];
  snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifname);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : -1; /* IPv6 off host-wide: nothing to disable */
  int ok = write(fd, "1", 1) == 1;
  close(fd);
  return ok ? 0 : -1;
}

/* The sandbox end, run inside its netns: address, up, default route. */
static int sandbox_end(struct in_addr addr, struct in_addr gateway, unsigned prefix, char *why, size_t whylen) {
  struct mnl_socket *nl = nl_open(); /* a netlink socket speaks for the netns it was made in */
  if (!nl) return snprintf(why, whylen, "netlink socket in the sandbox's netns: %s", strerror(errno)), -1;
  int rc = -1;
  int index = (int)if_nametoindex("eth0");
  if (index == 0) snprintf(why, whylen, "eth0 not found in the sandbox's netns: %s", strerror(errno));
  else if (nl_addr_add(nl, index, addr, prefix) < 0) snprintf(why, whylen, "address on eth0: %s", strerror(errno));
  else if (nl_link_up(nl, index) < 0) snprintf(why, whylen, "eth0 up: %s", strerror(errno));
  else if (nl_default_route(nl, index, gateway) < 0) snprintf(why, whylen, "default route via the host end: %s", strerror(errno));
  else rc = 0;
  mnl_socket_close(nl);
  return rc;
}

/* `link` request: see the top of the file. Answers; returns -1 only when this process must stop. */
static int make_link(struct mnl_socket *host_nl, int home, long pid, const char *host, const char *host_addr_text,
                     const char *sandbox_addr_text, unsigned prefix) {
  char why[256] = "";
  struct in_addr host_addr, sandbox_addr;
  if (strlen(host) >= IFNAMSIZ || prefix > 32 || inet_pton(AF_INET, host_addr_text, &host_addr) != 1 ||
      inet_pton(AF_INET, sandbox_addr_text, &sandbox_addr) != 1) {
    answer("err", "malformed link request");
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
  int target = open(path, O_RDONLY | O_CLOEXEC);
  if (target < 0) {
    snprintf(why, sizeof why, "cannot open %s: %s", path, strerror(errno));
    answer("err", why);
    return 0;
  }
  int made = 0;
  int host_index = 0;
  if (nl_veth_add(host_nl, host, target) < 0) snprintf(why, sizeof why, "veth %s: %s", host, strerror(errno));
  else if ((made = 1, host_index = (int)if_nametoindex(host)) == 0) snprintf(why, sizeof why, "%s vanished: %s", host, strerror(errno));
  /* No IPv6 on the host end: a sandbox must not be able to install routes with router adverts. */
  else if (disable_ipv6(host) < 0) snprintf(why, sizeof why, "disable IPv6 on %s: %s", host, strerror(errno));
  else if (nl_addr_add(host_nl, host_index, host_addr, prefix) < 0) snprintf(why, sizeof why, "address on %s: %s", host, strerror(errno));
  else if (nl_link_up(host_nl, host_index) < 0) snprintf(why, sizeof why, "%s up: %s", host, strerror(errno));
  else if (setns(target, CLONE_NEWNET) != 0) snprintf(why, sizeof why, "setns into %s: %s", path, strerror(errno));
  else {
    sandbox_end(sandbox_addr, host_addr, prefix, why, sizeof why);
    /* Back home before anything else; if that fails, stop rather than serve the wrong netns. */
    if (setns(home, CLONE_NEWNET) != 0) {
      perror("dsec-nft: setns back to the host netns");
      close(target);
      return -1;
    }
  }
  close(target);
  if (why[0]) {
    if (made) nl_link_del(host_nl, host); /* deleting one end deletes both */
    answer("err", why);
  } else {
    answer("ok", "");
  }
  return 0;
}

/* Runs nft `commands` in the netns of `pid` (0: here). Returns -1 only when this process must stop. */
static int nft_request(int home, long pid, const char *commands) {
  sweep();
  if (pid == 0) {
    run_here(0, commands);
    return 0;
  }
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
    run_here(pid, commands);
    /* Back home before anything else; if that fails, stop rather than serve the wrong netns. */
    if (setns(home, CLONE_NEWNET) != 0) {
      perror("dsec-nft: setns back to the host netns");
      return -1;
    }
  }
  return 0;
}

int main(void) {
  int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) {
    perror("dsec-nft: open /proc/self/ns/net");
    return 1;
  }
  start_closer();
  struct mnl_socket *host_nl = nl_open();
  if (!host_nl) {
    perror("dsec-nft: netlink socket");
    return 1;
  }
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, stdin) > 0) {
    long pid;
    size_t len;
    unsigned prefix;
    char host[32], host_addr[32], sandbox_addr[32];
    if (sscanf(line, "forget %ld", &pid) == 1) {
      forget(pid);
      continue;
    }
    if (sscanf(line, "link %ld %31s %31s %31s %u", &pid, host, host_addr, sandbox_addr, &prefix) == 5) {
      if (make_link(host_nl, home, pid, host, host_addr, sandbox_addr, prefix) < 0) return 1;
      continue;
    }
    if (sscanf(line, "%ld %zu", &pid, &len) != 2 || len > MAX_REQUEST) {
      fprintf(stderr, "dsec-nft: malformed request\n");
      return 1;
    }
    char *buf = malloc(len + 1);
    if (!buf || fread(buf, 1, len, stdin) != len) {
      fprintf(stderr, "dsec-nft: short request\n");
      return 1;
    }
    buf[len] = '\0';
    int rc = nft_request(home, pid, buf);
    free(buf);
    if (rc < 0) return 1;
  }
  return 0;
}
