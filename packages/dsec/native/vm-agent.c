/*
 * dsec-vm-agent: PID 1 of a dsec microVM or VM guest, and the edge's only way into it.
 *
 * Boot: mounts /proc, /sys, /dev; loads the kernel modules packed beside it in the initramfs
 * (every .ko in /modules, in name order); finds the disks the edge attached by their virtio-blk serials
 * (layer0..layerN-1: the image's EROFS layers, read-only; upper: an ext4 disk of its own);
 * composes them with overlayfs exactly as a container's root is composed; moves into that root;
 * opens the virtio-serial port named "dsec.agent", puts itself out of every command's reach
 * (harden_agent) and says {"ev":"ready"}; the edge's first request gives it the channel's key.
 *
 * Then it serves the edge over that port (protocol: packages/dsec/src/edge/backends/vm/README.md):
 * frames of [u32 header length][u32 payload length][JSON header][payload], requests carrying an
 * id and a nonce the edge chose, events repeating both, each with the MAC of the channel's key
 * (send_frame): a result is the agent's or the edge refuses it. exec (streamed stdout/stderr,
 * stdin, signals to the command's process group, exit status; or under a pseudo-terminal, with
 * resize; optionally a third output pipe on fd 3, a Landlock domain of its own, a cgroup shared
 * with other commands), connections to TCP ports on the guest's loopback (flow-controlled by
 * credit from the edge), file read/write/stat/list/mkdir/remove/rename, sync, and `diff`: a tar
 * of the overlay upper (the guest's changes to its image, OCI whiteouts) for a snapshot as an
 * image.
 *
 * The port has one end in the guest (this process holds it; virtio_console refuses a second
 * opener with EBUSY, the device node is unlinked once open, and a port unplugged in the guest
 * powers it off: port_check) and one on the host (a unix socket in the sandbox's directory that
 * only the edge, as root, can open). Commands run as guest root, but each in a domain that reaches
 * neither this process nor the kernel beneath it (confine_command).
 *
 * A boot failure is printed on the console, which the edge keeps as console.log, and powers the
 * guest off: the edge reports the message as the create's failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <arpa/inet.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/random.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <termios.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADER (64 * 1024)
#define MAX_PAYLOAD (64 * 1024 * 1024)
#define MAX_PROCS 256
#define MAX_LAYERS 64
#define CHUNK 65536
#define MAX_CONNS 64
#define GROUP_ROOT "/sys/fs/cgroup/dsec"
/* <linux/fs.h>'s, spelt out: that header clashes with glibc's <sys/mount.h>. */
#define FIFREEZE _IOWR('X', 119, int)
#define FITHAW _IOWR('X', 120, int)

/* The overlay's upper directory on the guest's own disk, opened before the root moves onto the
   overlay (after that no path reaches it); `diff` reads it. Frozen: a diff runs (FIFREEZE). */
static int upper_fd = -1;
static int upper_frozen;

/* ---------- console and fatal errors ------------------------------------------------------ */

static void logmsg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "dsec-vm-agent: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static void fatal(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "dsec-vm-agent: fatal: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  sync();
  reboot(RB_POWER_OFF);
  _exit(1);
}

/* ---------- a small JSON reader: one flat object of strings, numbers, bools, string arrays --- */

#define MAX_KEYS 32
#define MAX_ARR 4096

struct jval {
  char key[32];
  int type; /* 's' string, 'n' number, 'b' bool, 'a' array of strings, '0' null */
  char *str;
  long long num;
  char **arr;
  int n;
};

struct jobj {
  struct jval v[MAX_KEYS];
  int n;
};

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  return p;
}

static int utf8_put(char *out, unsigned cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
  out[0] = (char)(0xE0 | (cp >> 12));
  out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[2] = (char)(0x80 | (cp & 0x3F));
  return 3;
}

/* Parses a JSON string at p (which points at the opening quote); returns a malloc'd copy. */
static char *parse_str(const char **pp) {
  const char *p = *pp;
  if (*p != '"') return NULL;
  p++;
  size_t cap = 64, len = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  while (*p && *p != '"') {
    if (len + 8 > cap) {
      /* Grown by hand, the old copy wiped: a string may be the channel's key (op_key). */
      char *o = malloc(cap * 2);
      if (!o) { explicit_bzero(out, cap); free(out); return NULL; }
      memcpy(o, out, len);
      explicit_bzero(out, cap);
      free(out);
      out = o;
      cap *= 2;
    }
    if (*p == '\\') {
      p++;
      switch (*p) {
      case 'n': out[len++] = '\n'; break;
      case 't': out[len++] = '\t'; break;
      case 'r': out[len++] = '\r'; break;
      case 'b': out[len++] = '\b'; break;
      case 'f': out[len++] = '\f'; break;
      case 'u': {
        unsigned cp = 0;
        for (int i = 1; i <= 4; i++) {
          char c = p[i];
          cp <<= 4;
          if (c >= '0' && c <= '9') cp |= (unsigned)(c - '0');
          else if (c >= 'a' && c <= 'f') cp |= (unsigned)(c - 'a' + 10);
          else if (c >= 'A' && c <= 'F') cp |= (unsigned)(c - 'A' + 10);
          else { free(out); return NULL; }
        }
        p += 4;
        len += (size_t)utf8_put(out + len, cp);
        break;
      }
      case '\0': free(out); return NULL;
      default: out[len++] = *p; break;
      }
      p++;
    } else {
      out[len++] = *p++;
    }
  }
  if (*p != '"') { free(out); return NULL; }
  out[len] = 0;
  *pp = p + 1;
  return out;
}

static void jobj_free(struct jobj *o) {
  for (int i = 0; i < o->n; i++) {
    free(o->v[i].str);
    for (int j = 0; j < o->v[i].n; j++) free(o->v[i].arr[j]);
    free(o->v[i].arr);
  }
  o->n = 0;
}

static int jobj_parse(const char *p, struct jobj *o) {
  memset(o, 0, sizeof *o);
  p = skip_ws(p);
  if (*p++ != '{') return -1;
  p = skip_ws(p);
  if (*p == '}') return 0;
  for (;;) {
    if (o->n >= MAX_KEYS) return -1;
    struct jval *v = &o->v[o->n];
    p = skip_ws(p);
    char *k = parse_str(&p);
    if (!k) return -1;
    snprintf(v->key, sizeof v->key, "%s", k);
    free(k);
    o->n++;
    p = skip_ws(p);
    if (*p++ != ':') return -1;
    p = skip_ws(p);
    if (*p == '"') {
      v->type = 's';
      if (!(v->str = parse_str(&p))) return -1;
    } else if (*p == '[') {
      v->type = 'a';
      v->arr = calloc(MAX_ARR, sizeof(char *));
      if (!v->arr) return -1;
      p = skip_ws(p + 1);
      if (*p == ']') p++;
      else for (;;) {
        if (v->n >= MAX_ARR) return -1;
        p = skip_ws(p);
        if (!(v->arr[v->n] = parse_str(&p))) return -1;
        v->n++;
        p = skip_ws(p);
        if (*p == ',') { p++; continue; }
        if (*p++ != ']') return -1;
        break;
      }
    } else if (!strncmp(p, "true", 4)) { v->type = 'b'; v->num = 1; p += 4; }
    else if (!strncmp(p, "false", 5)) { v->type = 'b'; v->num = 0; p += 5; }
    else if (!strncmp(p, "null", 4)) { v->type = '0'; p += 4; }
    else {
      char *end;
      v->type = 'n';
      v->num = strtoll(p, &end, 10);
      if (end == p) return -1;
      p = end;
      if (*p == '.') { p++; while (*p >= '0' && *p <= '9') p++; }
    }
    p = skip_ws(p);
    if (*p == ',') { p++; continue; }
    if (*p == '}') return 0;
    return -1;
  }
}

static struct jval *jget(struct jobj *o, const char *key, int type) {
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->v[i].key, key) && o->v[i].type == type) return &o->v[i];
  return NULL;
}
static const char *jstr(struct jobj *o, const char *key) {
  struct jval *v = jget(o, key, 's');
  return v ? v->str : NULL;
}
static long long jnum(struct jobj *o, const char *key, long long dflt) {
  struct jval *v = jget(o, key, 'n');
  return v ? v->num : dflt;
}
static int jbool(struct jobj *o, const char *key) {
  struct jval *v = jget(o, key, 'b');
  return v ? (int)v->num : 0;
}

/* ---------- a small JSON writer ----------------------------------------------------------- */

struct sbuf {
  char *b;
  size_t len, cap;
};

static void sb_add(struct sbuf *s, const char *d, size_t n) {
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 256;
    while (s->len + n + 1 > cap) cap *= 2;
    char *b = realloc(s->b, cap);
    if (!b) fatal("out of memory");
    s->b = b;
    s->cap = cap;
  }
  memcpy(s->b + s->len, d, n);
  s->len += n;
  s->b[s->len] = 0;
}

static void sb_printf(struct sbuf *s, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) sb_add(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string; bytes that are not valid text still round-trip as \u00XX (latin-1) escapes. */
static void sb_str(struct sbuf *s, const char *str) {
  sb_add(s, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
    if (*p == '"' || *p == '\\') { char e[2] = {'\\', (char)*p}; sb_add(s, e, 2); }
    else if (*p < 0x20 || *p == 0x7f) sb_printf(s, "\\u%04x", *p);
    else sb_add(s, (const char *)p, 1);
  }
  sb_add(s, "\"", 1);
}

/* ---------- SHA-256 and HMAC (FIPS 180-4, RFC 2104): the frames' MAC ----------------------- */

struct sha256 {
  uint32_t h[8];
  uint64_t len;
  unsigned char buf[64];
  size_t n;
};

static const uint32_t sha256_k[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
  0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
  0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
  0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
  0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
  0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(struct sha256 *s, const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (ROR32(e, 6) ^ ROR32(e, 11) ^ ROR32(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[i] + w[i];
    uint32_t t2 = (ROR32(a, 2) ^ ROR32(a, 13) ^ ROR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha256_init(struct sha256 *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->len = 0;
  s->n = 0;
}

static void sha256_update(struct sha256 *s, const void *data, size_t len) {
  const unsigned char *p = data;
  s->len += len;
  if (s->n) {
    size_t k = 64 - s->n < len ? 64 - s->n : len;
    memcpy(s->buf + s->n, p, k);
    s->n += k; p += k; len -= k;
    if (s->n < 64) return;
    sha256_block(s, s->buf);
    s->n = 0;
  }
  for (; len >= 64; p += 64, len -= 64) sha256_block(s, p);
  memcpy(s->buf, p, len);
  s->n = len;
}

static void sha256_final(struct sha256 *s, unsigned char out[32]) {
  uint64_t bits = s->len * 8;
  static const unsigned char pad[64] = {0x80};
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha256_update(s, pad, s->n < 56 ? 56 - s->n : 120 - s->n);
  sha256_update(s, lenb, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (unsigned char)(s->h[i] >> 24); out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(s->h[i] >> 8); out[4 * i + 3] = (unsigned char)s->h[i];
  }
}

/*
 * The channel's key: 32 random bytes the edge gives in its first request after `ready` (op
 * `key`), before any command can run, and keeps on the host (the VM's state.json). Every frame
 * the agent sends afterwards carries HMAC-SHA256(key, header || payload), so the edge accepts
 * only frames this process wrote: a program in the guest that found a way onto the port (a
 * re-plugged device, an fd it should never get) cannot make one. Kept as HMAC's two keyed
 * SHA-256 states, in memory nothing else reads (PID 1 is non-dumpable and mlock'ed: see
 * harden_agent), and wiped in every child right after fork.
 */
static struct sha256 mac_inner, mac_outer;
static int have_key;

static void mac_set_key(const unsigned char key[32]) {
  unsigned char block[64];
  for (int i = 0; i < 64; i++) block[i] = (unsigned char)((i < 32 ? key[i] : 0) ^ 0x36);
  sha256_init(&mac_inner);
  sha256_update(&mac_inner, block, 64);
  for (int i = 0; i < 64; i++) block[i] = (unsigned char)((i < 32 ? key[i] : 0) ^ 0x5c);
  sha256_init(&mac_outer);
  sha256_update(&mac_outer, block, 64);
  explicit_bzero(block, sizeof block);
  have_key = 1;
}

/* What a child of the agent must not keep (it runs a command's code, or lives on for a diff). */
static void mac_forget(void) {
  explicit_bzero(&mac_inner, sizeof mac_inner);
  explicit_bzero(&mac_outer, sizeof mac_outer);
  have_key = 0;
}

static void mac_hex(const char *header, size_t hlen, const void *payload, size_t plen, char out[65]) {
  static struct sha256 s; /* keyed state: kept off the stack, in this process's locked memory */
  unsigned char d[32];
  s = mac_inner;
  sha256_update(&s, header, hlen);
  if (plen) sha256_update(&s, payload, plen);
  sha256_final(&s, d);
  s = mac_outer;
  sha256_update(&s, d, 32);
  sha256_final(&s, d);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
  explicit_bzero(&s, sizeof s);
}

/* ---------- framing over the port ----------------------------------------------------------- */

static int port_fd = -1;
/* The port's sysfs `name` attribute, open since boot: reads fail (ENODEV) once that port is gone. */
static int port_attr_fd = -1;

static void write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, 1000);
        continue;
      }
      fatal("write to the agent port: %s", strerror(errno));
    }
    p += w;
    n -= (size_t)w;
  }
}

/*
 * One frame: [u32 header length][u32 payload length][header][payload]. With the key set, the
 * header sent is {"mac":"<64 hex>",<the rest of header>}, the MAC over `header` (as built, without
 * the mac member) and the payload: the edge takes the member off and checks it.
 */
static void send_frame(const char *header, const void *payload, size_t plen) {
  size_t hlen = strlen(header);
  char *out = NULL;
  if (have_key) {
    char mac[65];
    mac_hex(header, hlen, payload, plen, mac);
    out = malloc(hlen + 80);
    if (!out) fatal("out of memory");
    hlen = (size_t)snprintf(out, hlen + 80, "{\"mac\":\"%s\",%s", mac, header + 1);
    header = out;
  }
  unsigned char pre[8];
  uint32_t h = (uint32_t)hlen, l = (uint32_t)plen;
  pre[0] = (unsigned char)(h >> 24); pre[1] = (unsigned char)(h >> 16); pre[2] = (unsigned char)(h >> 8); pre[3] = (unsigned char)h;
  pre[4] = (unsigned char)(l >> 24); pre[5] = (unsigned char)(l >> 16); pre[6] = (unsigned char)(l >> 8); pre[7] = (unsigned char)l;
  write_all(port_fd, pre, 8);
  write_all(port_fd, header, hlen);
  if (plen) write_all(port_fd, payload, plen);
  free(out);
}

/*
 * Every event names its request twice: the id, and the nonce the edge put in that request (128
 * random bits, fresh per request). The edge takes an event only for an outstanding request whose
 * nonce it repeats. Empty for the guest's own `ready`.
 */
#define NONCE_MAX 64
static const char *req_nonce = ""; /* the nonce of the request being handled (handle) */

static void send_ev(long long id, const char *nonce, const char *ev, const char *extra, const void *payload, size_t plen) {
  char h[1200];
  snprintf(h, sizeof h, "{\"id\":%lld%s%s%s,\"ev\":\"%s\"%s%s}", id, nonce && *nonce ? ",\"nonce\":\"" : "", nonce && *nonce ? nonce : "",
           nonce && *nonce ? "\"" : "", ev, extra && *extra ? "," : "", extra ? extra : "");
  send_frame(h, payload, plen);
}

static void send_err(long long id, const char *nonce, int err, const char *what) {
  struct sbuf s = {0};
  sb_printf(&s, "{\"id\":%lld", id);
  if (nonce && *nonce) sb_printf(&s, ",\"nonce\":\"%s\"", nonce);
  sb_printf(&s, ",\"ev\":\"error\",\"errno\":%d,\"code\":", err);
  sb_str(&s, strerrorname_np(err) ? strerrorname_np(err) : "EIO");
  sb_add(&s, ",\"message\":", 11);
  char msg[1200];
  snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
  sb_str(&s, msg);
  sb_add(&s, "}", 1);
  send_frame(s.b, NULL, 0);
  free(s.b);
}

/* ---------- boot ---------------------------------------------------------------------------- */

static void must_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
  mkdir(dst, 0755);
  if (mount(src, dst, type, flags, data) < 0) fatal("mount %s on %s (%s): %s", src, dst, type, strerror(errno));
}

static int ko_filter(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 3 && !strcmp(d->d_name + n - 3, ".ko");
}

static void load_modules(void) {
  struct dirent **list;
  int n = scandir("/modules", &list, ko_filter, alphasort);
  for (int i = 0; i < n; i++) {
    char path[300];
    snprintf(path, sizeof path, "/modules/%s", list[i]->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fatal("open %s: %s", path, strerror(errno));
    if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST) fatal("load module %s: %s", path, strerror(errno));
    close(fd);
    free(list[i]);
  }
  if (n > 0) free(list);
}

static int read_line(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t r = read(fd, buf, n - 1);
  close(fd);
  if (r < 0) return -1;
  buf[r] = 0;
  while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == ' ')) buf[--r] = 0;
  return 0;
}

/* The kernel command line value of key (e.g. "dsec.layers="), or NULL. */
static const char *cmdline_value(const char *key, char *out, size_t n) {
  static char cmd[4096];
  if (read_line("/proc/cmdline", cmd, sizeof cmd) < 0) return NULL;
  for (char *tok = strtok(cmd, " "); tok; tok = strtok(NULL, " ")) {
    if (!strncmp(tok, key, strlen(key))) {
      snprintf(out, n, "%s", tok + strlen(key));
      return out;
    }
  }
  return NULL;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Finds /dev/vdX whose virtio serial is `serial`; waits for devices to appear (up to ~20 s). */
static void disk_by_serial(const char *serial, char *dev, size_t n) {
  for (int tries = 0; tries < 2000; tries++) {
    DIR *d = opendir("/sys/block");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (strncmp(e->d_name, "vd", 2)) continue;
      char p[300], s[64];
      snprintf(p, sizeof p, "/sys/block/%s/serial", e->d_name);
      if (read_line(p, s, sizeof s) == 0 && !strcmp(s, serial)) {
        snprintf(dev, n, "/dev/%s", e->d_name);
        closedir(d);
        return;
      }
    }
    if (d) closedir(d);
    msleep(10);
  }
  fatal("no virtio disk with serial %s", serial);
}

static int open_port(void) {
  for (int tries = 0; tries < 2000; tries++) {
    DIR *d = opendir("/sys/class/virtio-ports");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[300], name[64];
      snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", e->d_name);
      if (read_line(p, name, sizeof name) == 0 && !strcmp(name, "dsec.agent")) {
        char dev[300];
        snprintf(dev, sizeof dev, "/dev/%s", e->d_name);
        closedir(d);
        port_attr_fd = open(p, O_RDONLY | O_CLOEXEC);
        if (port_attr_fd < 0) fatal("open %s: %s", p, strerror(errno));
        int fd = open(dev, O_RDWR | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) fatal("open %s: %s", dev, strerror(errno));
        unlink(dev); /* nothing else in the guest gets a path to it */
        return fd;
      }
    }
    if (d) closedir(d);
    msleep(10);
  }
  fatal("no virtio-serial port named dsec.agent");
  return -1;
}

/*
 * Whether the port this process opened at boot still exists. Root in the guest can unbind the
 * virtio console driver and bind it again (sysfs, no capability needed): the agent's fd then
 * points at a port that is gone, and a new one with the same name appears for any process to
 * open. Its frames would carry no valid MAC, so the edge refuses them; the guest is powered off
 * all the same, so the edge sees a VM that ended rather than a channel that hangs.
 */
static void port_check(void) {
  char b[64];
  if (lseek(port_attr_fd, 0, SEEK_SET) == 0 && read(port_attr_fd, b, sizeof b) >= 0) return;
  if (errno == EINTR || errno == EAGAIN) return;
  fatal("the agent's virtio-serial port was unplugged in the guest (%s): powering off", strerror(errno));
}

static void loopback_up(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  close(s);
}

static void set_addr(struct sockaddr *sa, in_addr_t a) {
  struct sockaddr_in *in = (struct sockaddr_in *)sa;
  memset(in, 0, sizeof *in);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = a;
}

/*
 * eth0 (the VM's virtio-net NIC, a tap in QEMU's netns on the host) from the command line:
 * dsec.ip=A.B.C.D/N and dsec.gw=E.F.G.H. The egress policy is enforced in that netns, outside
 * the guest, so nothing here is a security boundary. Without dsec.ip the guest has loopback only.
 */
static void network_up(void) {
  char ipv[40], gwv[40];
  if (!cmdline_value("dsec.ip=", ipv, sizeof ipv) || !cmdline_value("dsec.gw=", gwv, sizeof gwv)) return;
  char *slash = strchr(ipv, '/');
  int bits = slash ? atoi(slash + 1) : 32;
  if (slash) *slash = 0;
  in_addr_t addr = inet_addr(ipv), gw = inet_addr(gwv);
  if (addr == INADDR_NONE || gw == INADDR_NONE || bits < 1 || bits > 32) fatal("bad dsec.ip=/dsec.gw= on the command line");
  in_addr_t mask = htonl(bits == 32 ? 0xffffffffu : ~((1u << (32 - bits)) - 1));
  for (int tries = 0; tries < 2000 && access("/sys/class/net/eth0", F_OK) != 0; tries++) msleep(10);
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) fatal("socket: %s", strerror(errno));
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
  set_addr(&ifr.ifr_addr, addr);
  if (ioctl(s, SIOCSIFADDR, &ifr) < 0) fatal("eth0 address: %s", strerror(errno));
  set_addr(&ifr.ifr_netmask, mask);
  if (ioctl(s, SIOCSIFNETMASK, &ifr) < 0) fatal("eth0 netmask: %s", strerror(errno));
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) fatal("eth0 flags: %s", strerror(errno));
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) fatal("eth0 up: %s", strerror(errno));
  struct rtentry rt;
  memset(&rt, 0, sizeof rt);
  set_addr(&rt.rt_dst, 0);
  set_addr(&rt.rt_genmask, 0);
  set_addr(&rt.rt_gateway, gw);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST) fatal("default route: %s", strerror(errno));
  close(s);
}

static void boot(void) {
  must_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  must_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  must_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  load_modules();

  char val[32];
  int layers = cmdline_value("dsec.layers=", val, sizeof val) ? atoi(val) : 0;
  if (layers < 1 || layers > MAX_LAYERS) fatal("dsec.layers= is missing or out of range");

  char dev[300];
  disk_by_serial("upper", dev, sizeof dev);
  must_mount(dev, "/mnt/upper", "ext4", MS_NOATIME, NULL);
  mkdir("/mnt/upper/upper", 0755);
  mkdir("/mnt/upper/work", 0755);
  upper_fd = open("/mnt/upper/upper", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (upper_fd < 0) fatal("open the upper directory: %s", strerror(errno));

  struct sbuf opts = {0};
  sb_add(&opts, "lowerdir=", 9);
  for (int i = layers - 1; i >= 0; i--) { /* topmost layer first */
    char serial[16], mp[64];
    snprintf(serial, sizeof serial, "layer%d", i);
    snprintf(mp, sizeof mp, "/mnt/l%d", i);
    disk_by_serial(serial, dev, sizeof dev);
    must_mount(dev, mp, "erofs", MS_RDONLY, NULL);
    sb_printf(&opts, "%s%s", mp, i ? ":" : "");
  }
  sb_printf(&opts, ",upperdir=/mnt/upper/upper,workdir=/mnt/upper/work,redirect_dir=off,metacopy=off");
  must_mount("overlay", "/newroot", "overlay", 0, opts.b);
  free(opts.b);

  /* The guest's root becomes the overlay; the initramfs stays beneath, unreachable. */
  if (chdir("/newroot") < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 || chdir("/") < 0)
    fatal("switch to the overlay root: %s", strerror(errno));
  must_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  must_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  must_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  must_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  must_mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  /* cgroup2, so the commands of one session share a group the edge can end at once (cgroup.kill):
     a job that called setsid leaves the process group, never the cgroup. No controllers. */
  if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) mkdir(GROUP_ROOT, 0755);
  else logmsg("cgroup2: %s (session commands share no cgroup)", strerror(errno));
  mkdir("/tmp", 01777);
  loopback_up();
  network_up();
  sethostname("sandbox", 7);
}


/* ---------- Landlock (the same rules as native/landlock-exec.c, applied in the child) ------ */

/*
 * The guest kernel's Landlock, applied by the command's own process before it execs, so nothing
 * of the agent stays in it. The ABI is stable: its constants are spelt out (as dsec-landlock does)
 * rather than taken from the build machine's headers. isolate: a domain of its own that changes
 * no file right that matters (a process an earlier command left running cannot ptrace it or open
 * its /proc/<pid>/fd, mem or environ). rw: changes to files only beneath those paths (and /dev's
 * standard nodes, /dev/shm, /dev/pts). Either fails closed: the command does not run.
 */
#define LL_CREATE_RULESET 444
#define LL_ADD_RULE 445
#define LL_RESTRICT_SELF 446
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)
#define LL_FS_TRUNCATE (1ULL << 14)

struct ll_path_beneath {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

static int ll_allow(int ruleset, const char *path, uint64_t handled) {
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) { close(fd); return -1; }
  struct ll_path_beneath rule = {.allowed_access = S_ISDIR(st.st_mode) ? handled : (handled & (LL_FS_WRITE_FILE | LL_FS_TRUNCATE)), .parent_fd = fd};
  long r = syscall(LL_ADD_RULE, ruleset, 1, &rule, 0);
  close(fd);
  return r == 0 ? 0 : -1;
}

/* Returns 0, or -1 with errno set (the command must not run). */
static int landlock_apply(struct jval *rw) {
  long abi = syscall(LL_CREATE_RULESET, NULL, 0, 1U);
  if (abi < 2) { errno = abi < 1 ? ENOSYS : EOPNOTSUPP; return -1; }
  uint64_t handled = LL_FS_MAKE_BLOCK | LL_FS_REFER;
  if (rw) {
    handled = LL_FS_WRITE_FILE | LL_FS_REMOVE_DIR | LL_FS_REMOVE_FILE | LL_FS_MAKE_CHAR | LL_FS_MAKE_DIR | LL_FS_MAKE_REG |
              LL_FS_MAKE_SOCK | LL_FS_MAKE_FIFO | LL_FS_MAKE_BLOCK | LL_FS_MAKE_SYM | LL_FS_REFER;
    if (abi >= 3) handled |= LL_FS_TRUNCATE;
  }
  uint64_t attr = handled; /* struct landlock_ruleset_attr's first field: the ABI 1-3 size */
  int ruleset = (int)syscall(LL_CREATE_RULESET, &attr, sizeof attr, 0);
  if (ruleset < 0) return -1;
  if (!rw) {
    /* Every domain refuses links and renames across directories unless REFER is granted. */
    int root = open("/", O_PATH | O_CLOEXEC);
    struct ll_path_beneath everywhere = {.allowed_access = LL_FS_REFER, .parent_fd = root};
    if (root < 0 || syscall(LL_ADD_RULE, ruleset, 1, &everywhere, 0) != 0) return -1;
    close(root);
  } else {
    static const char *const dev_files[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
                                            "/dev/shm", "/dev/pts", "/dev/mqueue"};
    for (size_t d = 0; d < sizeof dev_files / sizeof *dev_files; d++)
      if (ll_allow(ruleset, dev_files[d], handled) != 0 && errno != ENOENT) return -1;
    for (int i = 0; i < rw->n; i++)
      if (ll_allow(ruleset, rw->arr[i], handled) != 0) return -1;
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  if (syscall(LL_RESTRICT_SELF, ruleset, 0) != 0) return -1;
  close(ruleset);
  return 0;
}

/* ---------- what a command may reach (applied in the child, before it execs) ------------------ */

/*
 * A command runs as guest root, but in a domain that cannot reach this process (PID 1, which holds
 * the channel) or the guest kernel beneath it:
 *
 * - Capabilities a command never has, dropped from its bounding set (so no setuid binary or file
 *   capability brings them back) and from its other sets: SYS_PTRACE (the agent is non-dumpable,
 *   so without it neither ptrace, pidfd_getfd, process_vm_* nor /proc/1/{mem,fd,environ,...} reach
 *   it), and what would give the guest kernel, and with it any process's memory and the port's
 *   device, to a command: SYS_MODULE, SYS_RAWIO (/dev/mem, /dev/port, ioperm, /proc/kcore),
 *   SYS_BOOT (kexec), BPF and PERFMON. SYS_ADMIN stays: mounts, namespaces, Docker.
 * - A seccomp filter (a second wall, which no capability lifts): pidfd_getfd, bpf, kexec_*,
 *   *_module, iopl and ioperm refused outright; ptrace, process_vm_readv/writev and kcmp refused
 *   for pid 1; perf_event_open refused system-wide, for pid 1 and per cgroup (CAP_SYS_ADMIN
 *   still implies perfmon). ptrace of a command's own processes stays (strace, gdb); Yama's
 *   ptrace_scope=1 (harden_agent) keeps it to descendants.
 * - CONFINED_MARK_CAP only in confined commands (session commands, writablePaths), never in
 *   plain ones: the kernel lets a process inspect another (ptrace, /proc/<pid>/{fd,mem,environ},
 *   pidfd_getfd) only if it holds every capability the other holds, so what a plain command left
 *   running cannot reach into a later confined one even in READ mode, where Yama does not apply
 *   and Landlock does not scope an unconfined process. (A confined command's own Landlock domain
 *   keeps its leftovers away from every other command.)
 */
static const int deny_caps[] = {CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_BOOT, CAP_BPF, CAP_PERFMON};
#define CONFINED_MARK_CAP CAP_AUDIT_READ /* nothing in a guest needs it (no audit daemon reads the log) */

static uint64_t denied_cap_mask(int confined) {
  uint64_t m = 0;
  for (size_t i = 0; i < sizeof deny_caps / sizeof *deny_caps; i++) m |= 1ULL << deny_caps[i];
  if (!confined) m |= 1ULL << CONFINED_MARK_CAP;
  return m;
}

static int caps_drop(uint64_t mask) {
  for (int c = 0; c < 64; c++)
    if ((mask >> c & 1) && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) return -1;
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) return -1;
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) != 0) return -1;
  for (int i = 0; i < 2; i++) {
    uint32_t keep = ~(uint32_t)(mask >> (32 * i));
    data[i].effective &= keep;
    data[i].permitted &= keep;
    data[i].inheritable &= keep;
  }
  return syscall(SYS_capset, &hdr, data) == 0 ? 0 : -1;
}

/* seccomp's view of a call: the low 32 bits of an argument (pids, flags: the kernel reads an int). */
#define SC_NR offsetof(struct seccomp_data, nr)
#define SC_ARCH offsetof(struct seccomp_data, arch)
#define SC_ARG(i) offsetof(struct seccomp_data, args[i])
#define SC_DENY_ALL 0 /* the call is refused whatever its arguments */
#define SC_EQ 1       /* refused when the argument equals val */
#define SC_SET 2      /* refused when the argument has any bit of val */

struct sc_check {
  int how, arg;
  uint32_t val;
};
struct sc_rule {
  int nr;
  struct sc_check checks[3];
  int n;
};

/* The rules for one ABI: x86_64's numbers, then i386's (a static 32-bit program uses int 0x80). */
#define SC_ALWAYS(nr_) {.nr = (nr_), .n = 0}
#define SC_PID1(nr_, arg_) {.nr = (nr_), .checks = {{SC_EQ, (arg_), 1}}, .n = 1}
#define SC_KCMP(nr_) {.nr = (nr_), .checks = {{SC_EQ, 0, 1}, {SC_EQ, 1, 1}}, .n = 2}
#define SC_PERF(nr_) {.nr = (nr_), .checks = {{SC_EQ, 1, 0xffffffffu}, {SC_EQ, 1, 1}, {SC_SET, 4, 1u << 2 /* PERF_FLAG_PID_CGROUP */}}, .n = 3}
static const struct sc_rule sc_x86_64[] = {
  SC_ALWAYS(438 /* pidfd_getfd */), SC_ALWAYS(321 /* bpf */), SC_ALWAYS(246 /* kexec_load */), SC_ALWAYS(320 /* kexec_file_load */),
  SC_ALWAYS(175 /* init_module */), SC_ALWAYS(313 /* finit_module */), SC_ALWAYS(176 /* delete_module */), SC_ALWAYS(172 /* iopl */),
  SC_ALWAYS(173 /* ioperm */), SC_PID1(101 /* ptrace */, 1), SC_PID1(310 /* process_vm_readv */, 0), SC_PID1(311 /* process_vm_writev */, 0),
  SC_KCMP(312 /* kcmp */), SC_PERF(298 /* perf_event_open */)};
static const struct sc_rule sc_i386[] = {
  SC_ALWAYS(438 /* pidfd_getfd */), SC_ALWAYS(357 /* bpf */), SC_ALWAYS(283 /* kexec_load */), SC_ALWAYS(128 /* init_module */),
  SC_ALWAYS(350 /* finit_module */), SC_ALWAYS(129 /* delete_module */), SC_ALWAYS(110 /* iopl */), SC_ALWAYS(101 /* ioperm */),
  SC_PID1(26 /* ptrace */, 1), SC_PID1(347 /* process_vm_readv */, 0), SC_PID1(348 /* process_vm_writev */, 0), SC_KCMP(349 /* kcmp */),
  SC_PERF(336 /* perf_event_open */)};

struct sc_prog {
  struct sock_filter ins[256];
  int n;
  int to_deny[128]; /* instructions whose true branch goes to the final EPERM (patched at the end) */
  int nd;
};

static void sc_emit(struct sc_prog *p, struct sock_filter f) {
  if (p->n < (int)(sizeof p->ins / sizeof *p->ins)) p->ins[p->n] = f;
  p->n++;
}

static void sc_emit_deny_if(struct sc_prog *p, uint16_t code, uint32_t k) {
  if (p->nd < (int)(sizeof p->to_deny / sizeof *p->to_deny)) p->to_deny[p->nd++] = p->n;
  sc_emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | code | BPF_K, k, 0, 0));
}

/* One ABI's rules, the syscall number loaded: each rule tests its number, then its arguments. */
static void sc_emit_rules(struct sc_prog *p, const struct sc_rule *rules, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const struct sc_rule *r = &rules[i];
    if (r->n == 0) { sc_emit_deny_if(p, BPF_JEQ, (uint32_t)r->nr); continue; }
    /* Not this call: skip its block (2 instructions per check, then reload nr). */
    sc_emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)r->nr, 0, (uint8_t)(2 * r->n + 1)));
    for (int c = 0; c < r->n; c++) {
      sc_emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SC_ARG(r->checks[c].arg)));
      sc_emit_deny_if(p, r->checks[c].how == SC_SET ? BPF_JSET : BPF_JEQ, r->checks[c].val);
    }
    sc_emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SC_NR));
  }
}

static int seccomp_apply(void) {
  static struct sc_prog p;
  memset(&p, 0, sizeof p);
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SC_ARCH));
  int to_i386 = p.n;
  sc_emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 0)); /* jf patched below */
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SC_NR));
  sc_emit_deny_if(&p, BPF_JSET, 0x40000000u); /* x32's numbers: not offered to commands at all */
  sc_emit_rules(&p, sc_x86_64, sizeof sc_x86_64 / sizeof *sc_x86_64);
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  if (p.n - to_i386 - 1 > 255) { errno = E2BIG; return -1; }
  p.ins[to_i386].jf = (uint8_t)(p.n - to_i386 - 1);
  /* i386 (a 32-bit program's int 0x80); any other architecture is refused outright. */
  sc_emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 1, 0));
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SC_NR));
  sc_emit_rules(&p, sc_i386, sizeof sc_i386 / sizeof *sc_i386);
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  int deny = p.n;
  sc_emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
  if (p.n > (int)(sizeof p.ins / sizeof *p.ins) || p.nd >= (int)(sizeof p.to_deny / sizeof *p.to_deny)) { errno = E2BIG; return -1; }
  for (int i = 0; i < p.nd; i++) {
    int off = deny - p.to_deny[i] - 1;
    if (off > 255) { errno = E2BIG; return -1; }
    p.ins[p.to_deny[i]].jt = (uint8_t)off;
  }
  struct sock_fprog prog = {.len = (unsigned short)p.n, .filter = p.ins};
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : -1;
}

/* Returns 0, or -1 with errno set (the command must not run). */
static int confine_command(int confined) {
  if (caps_drop(denied_cap_mask(confined)) != 0) return -1;
  return seccomp_apply();
}

/* A group name the edge chose: [a-z0-9-], 1..40 characters (it becomes a directory name). */
static int group_name_ok(const char *g) {
  size_t n = strlen(g);
  if (n == 0 || n > 40) return 0;
  for (const char *p = g; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) return 0;
  return 1;
}

/* Ends every process of a group (cgroup.kill) and removes it once empty. */
static void op_kill_group(long long id, struct jobj *o) {
  const char *g = jstr(o, "group");
  if (!g || !group_name_ok(g)) { send_err(id, req_nonce, EINVAL, "kill_group: bad group name"); return; }
  char path[200];
  snprintf(path, sizeof path, GROUP_ROOT "/%s/cgroup.kill", g);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) { send_err(id, req_nonce, errno, path); return; } /* ENOENT: the group never ran a command */
  if (write(fd, "1", 1) < 0) { int e = errno; close(fd); send_err(id, req_nonce, e, path); return; }
  close(fd);
  snprintf(path, sizeof path, GROUP_ROOT "/%s", g);
  /* The killed processes leave the group as they finish exiting; an empty one goes at once. */
  for (int i = 0; i < 50 && rmdir(path) < 0 && errno == EBUSY; i++) msleep(2);
  send_ev(id, req_nonce, "ok", NULL, NULL, 0);
}

/* ---------- processes ----------------------------------------------------------------------- */

struct proc {
  long long id; /* the edge's request id; 0: free slot */
  char nonce[NONCE_MAX + 1]; /* that request's nonce, repeated in each of its events */
  pid_t pid;
  int out, err, in, fd3; /* -1 once closed (fd3: -1 when not asked for) */
  char group[48];           /* its guest cgroup, removed once empty after it exits ("" for none) */
  long long credit;         /* stdout and stderr bytes the edge takes before it gives more (credit); -1: no window */
  int thaw;                 /* a diff: the upper disk is thawed when it exits */
  long long deadline_ms;    /* killed at this CLOCK_MONOTONIC time (a diff's bound); 0: none */
  char *in_pend;            /* stdin bytes the command has not read yet, written as its pipe drains */
  size_t in_len;
  int in_eof;               /* the edge's eof: stdin closes once in_pend is written */
};

static struct proc procs[MAX_PROCS];

static struct proc *proc_by_id(long long id) {
  for (int i = 0; i < MAX_PROCS; i++) if (procs[i].id == id) return &procs[i];
  return NULL;
}

static void op_exec(long long id, struct jobj *o) {
  struct jval *argv = jget(o, "argv", 'a'), *env = jget(o, "env", 'a');
  if (!argv || argv->n == 0) { send_err(id, req_nonce, EINVAL, "exec: argv is empty"); return; }
  if (proc_by_id(id)) { send_err(id, req_nonce, EEXIST, "exec: id in use"); return; }
  struct proc *slot = proc_by_id(0);
  if (!slot) { send_err(id, req_nonce, EAGAIN, "exec: too many processes"); return; }
  int po[2], pe[2], pi[2], ps[2], p3[2] = {-1, -1};
  int pty = jbool(o, "pty"), master = -1;
  char slave[128] = "";
  /* isolate / rw: a Landlock domain of its own (landlock_apply); group: a cgroup shared with
     the other commands of one session; fd3: a third output pipe (a session's state). */
  int isolate = jbool(o, "isolate"), want_fd3 = jbool(o, "fd3");
  struct jval *rw = jget(o, "rw", 'a');
  const char *group = jstr(o, "group");
  char procs_path[200] = "";
  if (group) {
    if (!group_name_ok(group)) { send_err(id, req_nonce, EINVAL, "exec: bad group name"); return; }
    snprintf(procs_path, sizeof procs_path, GROUP_ROOT "/%s", group);
    if (mkdir(procs_path, 0755) < 0 && errno != EEXIST) { send_err(id, req_nonce, errno, procs_path); return; }
    snprintf(procs_path, sizeof procs_path, GROUP_ROOT "/%s/cgroup.procs", group);
  }
  if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(pi, O_CLOEXEC) || pipe2(ps, O_CLOEXEC) || (want_fd3 && pipe2(p3, O_CLOEXEC))) {
    send_err(id, req_nonce, errno, "exec: pipe");
    return;
  }
  if (pty) {
    /* The terminal is the guest's own: its devpts, its line discipline; the edge sees bytes. */
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 || ptsname_r(master, slave, sizeof slave) != 0) {
      send_err(id, req_nonce, errno, "exec: open a pseudo-terminal");
      if (master >= 0) close(master);
      close(po[0]); close(po[1]); close(pe[0]); close(pe[1]); close(pi[0]); close(pi[1]); close(ps[0]); close(ps[1]);
      return;
    }
    struct winsize ws = {.ws_row = (unsigned short)jnum(o, "rows", 24), .ws_col = (unsigned short)jnum(o, "cols", 80)};
    ioctl(master, TIOCSWINSZ, &ws);
  }
  const char *cwd = jstr(o, "cwd");
  uid_t uid = (uid_t)jnum(o, "uid", 0);
  gid_t gid = (gid_t)jnum(o, "gid", 0);
  int want_stdin = jbool(o, "stdin");
  char **av = calloc((size_t)argv->n + 1, sizeof(char *));
  char **ev = calloc((size_t)(env ? env->n : 0) + 1, sizeof(char *));
  for (int i = 0; i < argv->n; i++) av[i] = argv->arr[i];
  for (int i = 0; env && i < env->n; i++) ev[i] = env->arr[i];
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    setsid();
    /* Nothing of the channel stays in the child (close-on-exec would leave the port open, and
       the key in memory, until the exec). Before the dup2s: these fds are never 0-3's targets. */
    mac_forget();
    close(port_fd);
    close(port_attr_fd);
    if (pty) {
      int s = open(slave, O_RDWR);
      if (s < 0 || ioctl(s, TIOCSCTTY, 0) < 0) _exit(126);
      dup2(s, 0);
      dup2(s, 1);
      dup2(s, 2);
      if (s > 2) close(s);
    } else {
      dup2(pi[0], 0);
      dup2(po[1], 1);
      dup2(pe[1], 2);
    }
    if (p3[1] >= 0) {
      if (p3[1] == 3) fcntl(3, F_SETFD, 0); /* dup2 onto itself would keep close-on-exec */
      else dup2(p3[1], 3);
    }
    int err = 0;
    const char *step = "";
    if (group && procs_path[0]) {
      /* In the group before it runs anything, so all it starts is born inside. */
      int g = open(procs_path, O_WRONLY | O_CLOEXEC);
      if (g < 0 || write(g, "0", 1) < 0) { err = errno; step = "cgroup"; }
      if (g >= 0) close(g);
    }
    if (err) {}
    else if (cwd && chdir(cwd) < 0) { err = errno; step = "chdir"; }
    else if ((isolate || rw) && landlock_apply(rw) < 0) { err = errno; step = "landlock"; }
    else if (confine_command(isolate || rw) < 0) { err = errno; step = "confine"; }
    else if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0) { err = errno; step = "set user"; }
    else {
      /* PATH from the command's env, as execvpe does with the caller's environ. */
      for (int i = 0; ev[i]; i++) if (!strncmp(ev[i], "PATH=", 5)) setenv("PATH", ev[i] + 5, 1);
      execvpe(av[0], av, ev);
      err = errno;
      step = "exec";
    }
    char msg[64];
    int n = snprintf(msg, sizeof msg, "%s %d", step, err);
    if (write(ps[1], msg, (size_t)n) < 0) _exit(127);
    _exit(127);
  }
  if (pty) {
    /* Output and input both go through the terminal's master side; no separate stderr. */
    close(po[0]); close(po[1]); close(pe[0]); close(pe[1]); close(pi[1]);
    po[0] = master;
    po[1] = -1;
    pi[1] = fcntl(master, F_DUPFD_CLOEXEC, 0);
    if (pipe2(pe, O_CLOEXEC) == 0) close(pe[1]); /* an stderr that is at EOF at once */
    pe[1] = -1;
  }
  free(av);
  free(ev);
  if (po[1] >= 0) close(po[1]);
  if (pe[1] >= 0) close(pe[1]);
  if (p3[1] >= 0) close(p3[1]);
  close(pi[0]);
  close(ps[1]);
  if (pid < 0) {
    send_err(id, req_nonce, errno, "exec: fork");
    close(po[0]); close(pe[0]); close(pi[1]); close(ps[0]);
    if (p3[0] >= 0) close(p3[0]);
    return;
  }
  /* The status pipe closes on a successful exec; otherwise it carries the step and errno. */
  char msg[64];
  ssize_t n;
  do n = read(ps[0], msg, sizeof msg - 1); while (n < 0 && errno == EINTR);
  close(ps[0]);
  if (n > 0) {
    msg[n] = 0;
    char step[16] = "";
    int err = EIO;
    sscanf(msg, "%15s %d", step, &err);
    waitpid(pid, NULL, 0);
    close(po[0]); close(pe[0]); close(pi[1]);
    if (p3[0] >= 0) close(p3[0]);
    char what[4200];
    snprintf(what, sizeof what, "%s %s", step, argv->arr[0]);
    send_err(id, req_nonce, err, what);
    return;
  }
  fcntl(po[0], F_SETFL, O_NONBLOCK);
  fcntl(pe[0], F_SETFL, O_NONBLOCK);
  fcntl(pi[1], F_SETFL, O_NONBLOCK);
  if (p3[0] >= 0) fcntl(p3[0], F_SETFL, O_NONBLOCK);
  if (!want_stdin) { close(pi[1]); pi[1] = -1; }
  *slot = (struct proc){.id = id, .pid = pid, .out = po[0], .err = pe[0], .in = pi[1], .fd3 = p3[0], .credit = jnum(o, "window", -1)};
  snprintf(slot->nonce, sizeof slot->nonce, "%s", req_nonce);
  if (group) snprintf(slot->group, sizeof slot->group, "%s", group);
  char extra[64];
  snprintf(extra, sizeof extra, "\"pid\":%d", pid);
  send_ev(id, req_nonce, "started", extra, NULL, 0);
}

/* Reads what a pipe holds now (stdout and stderr: as much as the edge's credit allows); returns 0 at EOF (and closes it). */
static int drain(struct proc *p, int *fd, const char *ev) {
  static char buf[CHUNK];
  for (;;) {
    size_t want = sizeof buf;
    int windowed = (fd == &p->out || fd == &p->err) && p->credit >= 0;
    if (windowed && p->credit == 0) return 1;
    if (windowed && (long long)want > p->credit) want = (size_t)p->credit;
    ssize_t r = read(*fd, buf, want);
    if (r > 0) {
      if (windowed) p->credit -= r;
      send_ev(p->id, p->nonce, ev, NULL, buf, (size_t)r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return 1;
    close(*fd);
    *fd = -1;
    return 0;
  }
}

static void reaped(pid_t pid, int status) {
  for (int i = 0; i < MAX_PROCS; i++) {
    struct proc *p = &procs[i];
    if (!p->id || p->pid != pid) continue;
    /* Output written before the exit is in the pipes now: send it, then the exit (past the
       window: a pipe holds at most 64 KiB). Pipes a background grandchild still holds are
       closed here: the command is over. */
    p->credit = -1;
    if (p->thaw) {
      if (ioctl(upper_fd, FITHAW, 0) < 0) logmsg("thaw the upper disk: %s", strerror(errno));
      upper_frozen = 0;
    }
    if (p->out >= 0) { drain(p, &p->out, "stdout"); if (p->out >= 0) close(p->out); }
    if (p->err >= 0) { drain(p, &p->err, "stderr"); if (p->err >= 0) close(p->err); }
    if (p->fd3 >= 0) { drain(p, &p->fd3, "fd3"); if (p->fd3 >= 0) close(p->fd3); }
    if (p->in >= 0) close(p->in);
    free(p->in_pend);
    char extra[64];
    if (WIFSIGNALED(status)) snprintf(extra, sizeof extra, "\"code\":%d,\"signal\":%d", 128 + WTERMSIG(status), WTERMSIG(status));
    else snprintf(extra, sizeof extra, "\"code\":%d", WEXITSTATUS(status));
    send_ev(p->id, p->nonce, "exit", extra, NULL, 0);
    if (p->group[0]) {
      /* An empty group goes now; one its jobs still hold goes with kill_group. */
      char dir[200];
      snprintf(dir, sizeof dir, GROUP_ROOT "/%s", p->group);
      rmdir(dir);
    }
    memset(p, 0, sizeof *p);
    return;
  }
}

/* Writes what the command's stdin takes now; never blocks the agent. Closes stdin after an eof once all is written. */
static void stdin_flush(struct proc *p) {
  size_t done = 0;
  while (done < p->in_len) {
    ssize_t w = write(p->in, p->in_pend + done, p->in_len - done);
    if (w > 0) { done += (size_t)w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    done = p->in_len; /* the reader is gone: the rest cannot be delivered */
  }
  memmove(p->in_pend, p->in_pend + done, p->in_len - done);
  p->in_len -= done;
  if (!p->in_len && p->in_eof) { close(p->in); p->in = -1; }
}

/*
 * Stdin is queued and written as the command reads (POLLOUT in the loop): a command that reads
 * late neither stalls the agent nor loses bytes. The queue is the guest's memory; what the edge
 * sends is bounded per request (the API's stdin limits).
 */
static void op_stdin(long long id, struct jobj *o, const char *payload, size_t plen) {
  struct proc *p = proc_by_id(id);
  if (!p || p->in < 0 || p->in_eof) return; /* exited or stdin closed: the edge already knows */
  if (plen) {
    char *grown = realloc(p->in_pend, p->in_len + plen);
    if (!grown) fatal("out of memory");
    p->in_pend = grown;
    memcpy(p->in_pend + p->in_len, payload, plen);
    p->in_len += plen;
  }
  if (jbool(o, "eof")) p->in_eof = 1;
  stdin_flush(p);
}

static void op_resize(long long id, struct jobj *o) {
  struct proc *p = proc_by_id(id);
  if (!p || p->out < 0) return;
  struct winsize ws = {.ws_row = (unsigned short)jnum(o, "rows", 24), .ws_col = (unsigned short)jnum(o, "cols", 80)};
  ioctl(p->out, TIOCSWINSZ, &ws); /* the kernel sends SIGWINCH to the terminal's foreground group */
}

static void op_signal(long long id, struct jobj *o) {
  struct proc *p = proc_by_id(id);
  if (!p) return;
  int sig = (int)jnum(o, "signal", SIGKILL);
  if (kill(-p->pid, sig) < 0) kill(p->pid, sig);
}


/* ---------- connections to the guest's own ports (the edge's port route) -------------------- */

/*
 * A TCP connection from the edge to a port on the guest's loopback, relayed over the channel:
 * `connect` {port} answers ok (or the connect's errno), then `data` events carry what the guest
 * side sends and `eof` its end; `send` (payload; eof: shut the write side) and `close` come from
 * the edge. Nothing is opened on the guest's network: it is the guest's own 127.0.0.1.
 */
struct conn {
  long long id; /* 0: free slot */
  char nonce[NONCE_MAX + 1];
  int fd;
  int eof; /* the guest side has ended; no more reads */
  long long credit; /* bytes the edge takes before it gives more (credit); -1: no window */
  char *pend;       /* bytes from the edge the guest's socket has not taken yet, written as it drains */
  size_t pend_len;
  int shut_pending; /* the edge's eof, applied once pend is written */
  int acks;         /* the edge counts what it sent: a `sent` event for what the socket took */
};

/* Writes what the guest's socket takes of the edge's bytes now; never blocks the agent. */
static void conn_flush(struct conn *c) {
  size_t done = 0;
  while (done < c->pend_len) {
    ssize_t w = write(c->fd, c->pend + done, c->pend_len - done);
    if (w > 0) { done += (size_t)w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    done = c->pend_len; /* the guest side is gone: the rest cannot be delivered */
  }
  if (done) {
    memmove(c->pend, c->pend + done, c->pend_len - done);
    c->pend_len -= done;
    if (c->acks) {
      char extra[48];
      snprintf(extra, sizeof extra, "\"bytes\":%zu", done);
      send_ev(c->id, c->nonce, "sent", extra, NULL, 0);
    }
  }
  if (!c->pend_len && c->shut_pending) {
    shutdown(c->fd, SHUT_WR);
    c->shut_pending = 0;
  }
}

static struct conn conns[MAX_CONNS];

static struct conn *conn_by_id(long long id) {
  for (int i = 0; i < MAX_CONNS; i++) if (conns[i].id == id) return &conns[i];
  return NULL;
}

static void op_connect(long long id, struct jobj *o) {
  long long port = jnum(o, "port", 0);
  if (port < 1 || port > 65535) { send_err(id, req_nonce, EINVAL, "connect: port out of range"); return; }
  if (conn_by_id(id)) { send_err(id, req_nonce, EEXIST, "connect: id in use"); return; }
  struct conn *c = conn_by_id(0);
  if (!c) { send_err(id, req_nonce, EAGAIN, "connect: too many connections"); return; }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { send_err(id, req_nonce, errno, "connect: socket"); return; }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  /* Loopback answers a connect at once (accepted, or refused with nothing listening). */
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    int e = errno;
    close(fd);
    char what[64];
    snprintf(what, sizeof what, "connect to 127.0.0.1:%lld", port);
    send_err(id, req_nonce, e, what);
    return;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  *c = (struct conn){.id = id, .fd = fd, .credit = jnum(o, "window", -1), .acks = jbool(o, "acks")};
  snprintf(c->nonce, sizeof c->nonce, "%s", req_nonce);
  send_ev(id, req_nonce, "ok", NULL, NULL, 0);
}

static void conn_readable(struct conn *c) {
  static char buf[CHUNK];
  size_t want = sizeof buf;
  if (c->credit == 0) return;
  if (c->credit > 0 && (long long)want > c->credit) want = (size_t)c->credit;
  ssize_t r;
  do r = read(c->fd, buf, want); while (r < 0 && errno == EINTR);
  if (r > 0) {
    if (c->credit > 0) c->credit -= r;
    send_ev(c->id, c->nonce, "data", NULL, buf, (size_t)r);
    return;
  }
  if (r < 0 && errno == EAGAIN) return;
  c->eof = 1; /* end of stream or a reset: either way the guest side is done */
  send_ev(c->id, c->nonce, "eof", NULL, NULL, 0);
}

/*
 * Bytes for the guest's socket are queued and written as it drains (POLLOUT in the loop), so a
 * guest server that reads slowly neither stalls the agent nor loses data; with `acks` the edge
 * keeps at most its send window unconfirmed, which bounds the queue. An eof waits for the queue.
 */
static void op_send(long long id, struct jobj *o, const char *payload, size_t plen) {
  struct conn *c = conn_by_id(id);
  if (!c) return; /* closed meanwhile: the edge knows */
  if (plen) {
    char *grown = realloc(c->pend, c->pend_len + plen);
    if (!grown) fatal("out of memory");
    c->pend = grown;
    memcpy(c->pend + c->pend_len, payload, plen);
    c->pend_len += plen;
  }
  if (jbool(o, "eof")) c->shut_pending = 1;
  conn_flush(c);
}

/*
 * Flow control: a connection or command opened with `window` sends at most that many bytes of
 * data (a command: stdout and stderr together) until the edge grants more with `credit`
 * {bytes}, as its reader takes them. The agent then stops reading that socket or pipe, so the
 * guest's writer blocks (TCP's window, a full pipe) rather than the edge buffering without bound.
 */
static void op_credit(long long id, struct jobj *o) {
  long long n = jnum(o, "bytes", 0);
  if (n <= 0 || n > MAX_PAYLOAD) return;
  struct proc *p = proc_by_id(id);
  if (p && p->credit >= 0) { p->credit += n; return; }
  struct conn *c = conn_by_id(id);
  if (c && c->credit >= 0) c->credit += n;
}

static void op_close(long long id) {
  struct conn *c = conn_by_id(id);
  if (!c) return;
  free(c->pend);
  close(c->fd);
  memset(c, 0, sizeof *c);
}

/* ---------- files ------------------------------------------------------------------------- */

static void stat_json(struct sbuf *s, const char *name, const char *path, struct stat *st) {
  const char *type = S_ISREG(st->st_mode) ? "file" : S_ISDIR(st->st_mode) ? "dir" : S_ISLNK(st->st_mode) ? "symlink" : "other";
  sb_add(s, "{\"name\":", 8);
  sb_str(s, name);
  sb_printf(s, ",\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"uid\":%u,\"gid\":%u,\"mtimeMs\":%lld", type, (long long)st->st_size,
            (unsigned)(st->st_mode & 07777), (unsigned)st->st_uid, (unsigned)st->st_gid,
            (long long)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000);
  if (S_ISLNK(st->st_mode)) {
    char target[4097];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n >= 0) {
      target[n] = 0;
      sb_add(s, ",\"linkTarget\":", 14);
      sb_str(s, target);
    }
  }
  sb_add(s, "}", 1);
}

static void op_read(long long id, const char *path, long long max) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) { send_err(id, req_nonce, errno, path); return; }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    send_err(id, req_nonce, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, path);
    return;
  }
  if (st.st_size > max) {
    close(fd);
    char extra[64];
    snprintf(extra, sizeof extra, "\"size\":%lld", (long long)st.st_size);
    send_ev(id, req_nonce, "too_large", extra, NULL, 0);
    return;
  }
  static char buf[CHUNK];
  long long total = 0;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { int e = errno; close(fd); send_err(id, req_nonce, e, path); return; }
    if (r == 0) break;
    total += r;
    if (total > max) break;
    send_ev(id, req_nonce, "data", NULL, buf, (size_t)r);
  }
  close(fd);
  char extra[64];
  snprintf(extra, sizeof extra, "\"size\":%lld", total);
  send_ev(id, req_nonce, "ok", extra, NULL, 0);
}

static int mkdir_p(char *path);

static void op_write(long long id, const char *path, long long mode, const char *payload, size_t plen) {
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) { send_err(id, req_nonce, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, path); return; }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, (mode_t)mode);
  if (fd < 0 && errno == ENOENT && strrchr(path, '/') && strrchr(path, '/') != path) {
    /* Missing parent directories are made (0755), as the container files API makes them. */
    char *parent = strdup(path);
    *strrchr(parent, '/') = 0;
    int made = mkdir_p(parent);
    free(parent);
    if (made == 0) fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, (mode_t)mode);
    else errno = errno == EEXIST ? ENOTDIR : errno;
  }
  if (fd < 0) { send_err(id, req_nonce, errno, path); return; }
  size_t off = 0;
  while (off < plen) {
    ssize_t w = write(fd, payload + off, plen - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) { int e = errno; close(fd); send_err(id, req_nonce, e, path); return; }
    off += (size_t)w;
  }
  fchmod(fd, (mode_t)mode);
  close(fd);
  char extra[64];
  snprintf(extra, sizeof extra, "\"size\":%zu", plen);
  send_ev(id, req_nonce, "ok", extra, NULL, 0);
}

static void op_stat(long long id, const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0) { send_err(id, req_nonce, errno, path); return; }
  const char *name = strrchr(path, '/');
  struct sbuf s = {0};
  stat_json(&s, name && name[1] ? name + 1 : path, path, &st);
  send_ev(id, req_nonce, "ok", NULL, s.b, s.len);
  free(s.b);
}

static void op_list(long long id, const char *path, long long max) {
  DIR *d = opendir(path);
  if (!d) { send_err(id, req_nonce, errno, path); return; }
  struct sbuf s = {0};
  sb_add(&s, "[", 1);
  struct dirent *e;
  long long n = 0;
  int truncated = 0;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (n >= max) { truncated = 1; break; }
    char full[8192];
    snprintf(full, sizeof full, "%s/%s", strcmp(path, "/") ? path : "", e->d_name);
    struct stat st;
    if (lstat(full, &st) < 0) continue;
    if (n++) sb_add(&s, ",", 1);
    stat_json(&s, e->d_name, full, &st);
  }
  closedir(d);
  sb_add(&s, "]", 1);
  send_ev(id, req_nonce, "ok", truncated ? "\"truncated\":true" : "\"truncated\":false", s.b, s.len);
  free(s.b);
}

static int mkdir_p(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int r = mkdir(path, 0755);
    *p = '/';
    if (r < 0 && errno != EEXIST) return -1;
  }
  if (mkdir(path, 0755) < 0 && errno != EEXIST) return -1;
  struct stat st;
  if (stat(path, &st) < 0) return -1;
  if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
  return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st; (void)ftw;
  return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static void op_fs(long long id, const char *op, struct jobj *o) {
  const char *path = jstr(o, "path");
  if (!path && strcmp(op, "rename") && strcmp(op, "sync")) { send_err(id, req_nonce, EINVAL, "path is missing"); return; }
  int r = 0;
  const char *what = path;
  if (!strcmp(op, "mkdir")) {
    char *p = strdup(path);
    r = jbool(o, "parents") ? mkdir_p(p) : mkdir(p, 0755);
    free(p);
  } else if (!strcmp(op, "remove")) {
    struct stat st;
    r = lstat(path, &st);
    if (r == 0 && S_ISDIR(st.st_mode)) r = jbool(o, "recursive") ? nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS) : rmdir(path);
    else if (r == 0) r = unlink(path);
  } else if (!strcmp(op, "rename")) {
    const char *from = jstr(o, "from"), *to = jstr(o, "to");
    what = from ? from : "rename";
    r = from && to ? rename(from, to) : (errno = EINVAL, -1);
  } else if (!strcmp(op, "sync")) {
    sync();
  } else {
    r = -1;
    errno = ENOSYS;
    what = op;
  }
  if (r < 0) send_err(id, req_nonce, errno, what);
  else send_ev(id, req_nonce, "ok", NULL, NULL, 0);
}

/* ---------- the disk diff: the overlay upper as a tar (a snapshot as an image) ------------- */

/*
 * `diff` {scrub: [abs paths], window, timeoutMs}: the guest's changes to its image, the overlay's
 * upper directory, as a pax tar on stdout events (flow-controlled: window and credit), then
 * `exit` {code} (non-zero: the reason on stderr). The upper disk is frozen (FIFREEZE) while a
 * child process reads it, so the archive is one consistent state: the guest's writers wait, as a
 * container's processes do in the freezer; the agent refuses its own writes meanwhile (EBUSY)
 * rather than block on them. The child is killed at timeoutMs; its exit thaws the disk.
 *
 * The archive is an OCI layer: a whiteout (char 0:0 in the upper) is an empty file `.wh.NAME`,
 * an opaque directory (trusted.overlay.opaque=y) holds `.wh..wh..opq`; other overlay xattrs are
 * left out; user.* and security.capability go as pax SCHILY.xattr records, byte-exact. Hard
 * links are link entries to the first path of the inode. Sockets are left out. Sparse files are
 * written in full (the edge bounds the bytes). The edge trusts none of it: it reads the archive
 * with its untrusted-tar reader, within bounds.
 */
struct tar_link {
  dev_t dev;
  ino_t ino;
  char *path;
};

static struct tar_link *tar_links;
static size_t tar_nlinks, tar_caplinks;
static struct jval *tar_scrub;

static void tar_out(const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(1, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3); /* the agent closed the pipe: the edge went away */
    p += w;
    n -= (size_t)w;
  }
}

static void tar_zeros(size_t n) {
  static const char zero[512];
  while (n) {
    size_t k = n < sizeof zero ? n : sizeof zero;
    tar_out(zero, k);
    n -= k;
  }
}

/* One pax record, "<len> <key>=<value>\n", its length counting its own digits. */
static void pax_add(struct sbuf *s, const char *key, const char *val, size_t vlen) {
  size_t base = strlen(key) + vlen + 3, len = base + 1;
  for (;;) {
    char digits[24];
    size_t d = (size_t)snprintf(digits, sizeof digits, "%zu", len);
    if (base + d == len) break;
    len = base + d;
  }
  sb_printf(s, "%zu %s=", len, key);
  sb_add(s, val, vlen);
  sb_add(s, "\n", 1);
}

static void octal(char *field, size_t width, unsigned long long v) {
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%0*llo", (int)width - 1, v);
  memcpy(field, tmp, width - 1); /* the last byte stays NUL */
}

static void tar_block(const char *name, char type, unsigned mode, unsigned long long uid, unsigned long long gid, unsigned long long size,
                      long long mtime, const char *linkname, unsigned devmajor, unsigned devminor) {
  char h[512];
  memset(h, 0, sizeof h);
  snprintf(h, 100, "%s", name); /* a longer name went in a pax path record */
  octal(h + 100, 8, mode & 07777);
  octal(h + 108, 8, uid > 07777777 ? 0 : uid);
  octal(h + 116, 8, gid > 07777777 ? 0 : gid);
  octal(h + 124, 12, size > 077777777777ULL ? 0 : size);
  octal(h + 136, 12, mtime < 0 ? 0 : (unsigned long long)mtime);
  memset(h + 148, ' ', 8);
  h[156] = type;
  if (linkname) snprintf(h + 157, 100, "%s", linkname);
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  octal(h + 329, 8, devmajor);
  octal(h + 337, 8, devminor);
  unsigned sum = 0;
  for (size_t i = 0; i < sizeof h; i++) sum += (unsigned char)h[i];
  snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  tar_out(h, sizeof h);
}

/* An entry's header: a pax header first when a name, link, owner or size does not fit ustar, or xattrs. */
static void tar_entry(const char *name, char type, const struct stat *st, unsigned long long size, const char *linkname, struct sbuf *pax) {
  if (strlen(name) > 99) pax_add(pax, "path", name, strlen(name));
  if (linkname && strlen(linkname) > 99) pax_add(pax, "linkpath", linkname, strlen(linkname));
  char num[32];
  if (size > 077777777777ULL) pax_add(pax, "size", num, (size_t)snprintf(num, sizeof num, "%llu", size));
  if (st->st_uid > 07777777) pax_add(pax, "uid", num, (size_t)snprintf(num, sizeof num, "%u", (unsigned)st->st_uid));
  if (st->st_gid > 07777777) pax_add(pax, "gid", num, (size_t)snprintf(num, sizeof num, "%u", (unsigned)st->st_gid));
  if (pax->len) {
    tar_block("PaxHeader", 'x', 0644, 0, 0, pax->len, st->st_mtim.tv_sec, NULL, 0, 0);
    tar_out(pax->b, pax->len);
    tar_zeros((512 - pax->len % 512) % 512);
  }
  unsigned maj = (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) ? major(st->st_rdev) : 0;
  unsigned min = (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) ? minor(st->st_rdev) : 0;
  tar_block(name, type, st->st_mode, st->st_uid, st->st_gid, size, st->st_mtim.tv_sec, linkname, maj, min);
}

/* Xattrs an image layer keeps, as pax records; sets *opaque for an opaque directory. */
static void tar_xattrs(const char *path, struct sbuf *pax, int *opaque) {
  char names[65536];
  ssize_t n = llistxattr(path, names, sizeof names);
  for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(names + off) + 1) {
    const char *k = names + off;
    static char val[65536];
    if (!strcmp(k, "trusted.overlay.opaque")) {
      ssize_t v = lgetxattr(path, k, val, sizeof val);
      if (v == 1 && val[0] == 'y') *opaque = 1;
      continue;
    }
    if (strncmp(k, "user.", 5) && strcmp(k, "security.capability")) continue;
    ssize_t v = lgetxattr(path, k, val, sizeof val);
    if (v < 0) continue;
    char key[300];
    snprintf(key, sizeof key, "SCHILY.xattr.%s", k);
    pax_add(pax, key, val, (size_t)v);
  }
}

static int tar_scrubbed(const char *rel) {
  for (int i = 0; tar_scrub && i < tar_scrub->n; i++) {
    const char *s = tar_scrub->arr[i];
    while (*s == '/') s++;
    size_t k = strlen(s);
    if (k && !strncmp(rel, s, k) && (rel[k] == 0 || rel[k] == '/')) return 1;
  }
  return 0;
}

/* The first path archived of a hard-linked inode, or NULL (a linear scan: hard links are few). */
static const char *link_first(const struct stat *st, const char *self) {
  for (size_t i = 0; i < tar_nlinks; i++)
    if (tar_links[i].dev == st->st_dev && tar_links[i].ino == st->st_ino && strcmp(tar_links[i].path, self)) return tar_links[i].path;
  return NULL;
}

static void tar_empty_file(const char *name, const struct stat *dir) {
  struct stat st = {.st_mode = S_IFREG | 0644, .st_mtim = dir->st_mtim};
  struct sbuf pax = {0};
  tar_entry(name, '0', &st, 0, NULL, &pax);
  free(pax.b);
}

/* Writes `rel` (a path relative to the upper directory, the cwd) and, for a directory, what it holds. */
static void tar_walk(const char *rel) {
  DIR *d = opendir(*rel ? rel : ".");
  if (!d) { fprintf(stderr, "read %s: %s\n", *rel ? rel : "/", strerror(errno)); _exit(1); }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t len = strlen(rel) + strlen(e->d_name) + 2;
    char *path = malloc(len);
    snprintf(path, len, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
    struct stat st;
    if (tar_scrubbed(path) || lstat(path, &st) < 0 || S_ISSOCK(st.st_mode)) { free(path); continue; }
    if (S_ISCHR(st.st_mode) && st.st_rdev == 0) { /* an overlay whiteout: the OCI spelling */
      size_t wl = len + 4;
      char *wh = malloc(wl);
      snprintf(wh, wl, "%s%s.wh.%s", rel, *rel ? "/" : "", e->d_name);
      tar_empty_file(wh, &st);
      free(wh);
      free(path);
      continue;
    }
    struct sbuf pax = {0};
    int opaque = 0;
    tar_xattrs(path, &pax, &opaque);
    if (S_ISDIR(st.st_mode)) {
      tar_entry(path, '5', &st, 0, NULL, &pax);
      if (opaque) {
        size_t ol = len + 13;
        char *op = malloc(ol);
        snprintf(op, ol, "%s/.wh..wh..opq", path);
        tar_empty_file(op, &st);
        free(op);
      }
      tar_walk(path);
    } else if (st.st_nlink > 1 && link_first(&st, path)) {
      tar_entry(path, '1', &st, 0, link_first(&st, path), &pax);
    } else if (S_ISREG(st.st_mode)) {
      int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
      if (fd < 0) { fprintf(stderr, "open %s: %s\n", path, strerror(errno)); _exit(1); }
      unsigned long long size = (unsigned long long)st.st_size, done = 0;
      tar_entry(path, '0', &st, size, NULL, &pax);
      static char buf[CHUNK];
      while (done < size) {
        ssize_t r = read(fd, buf, size - done < sizeof buf ? (size_t)(size - done) : sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* cannot shrink while frozen; padded below regardless */
        tar_out(buf, (size_t)r);
        done += (unsigned long long)r;
      }
      close(fd);
      tar_zeros((size_t)(size - done));
      tar_zeros((size_t)((512 - size % 512) % 512));
    } else if (S_ISLNK(st.st_mode)) {
      char target[4097];
      ssize_t n = readlink(path, target, sizeof target - 1);
      if (n < 0) { fprintf(stderr, "readlink %s: %s\n", path, strerror(errno)); _exit(1); }
      target[n] = 0;
      tar_entry(path, '2', &st, 0, target, &pax);
    } else {
      tar_entry(path, S_ISCHR(st.st_mode) ? '3' : S_ISBLK(st.st_mode) ? '4' : '6', &st, 0, NULL, &pax);
    }
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1 && !link_first(&st, path)) {
      if (tar_nlinks == tar_caplinks) {
        tar_caplinks = tar_caplinks ? tar_caplinks * 2 : 64;
        tar_links = realloc(tar_links, tar_caplinks * sizeof *tar_links);
        if (!tar_links) _exit(1);
      }
      tar_links[tar_nlinks++] = (struct tar_link){.dev = st.st_dev, .ino = st.st_ino, .path = strdup(path)};
    }
    free(pax.b);
    free(path);
  }
  closedir(d);
}

static void op_diff(long long id, struct jobj *o) {
  if (upper_frozen) { send_err(id, req_nonce, EBUSY, "diff: a snapshot of the disk is already being taken"); return; }
  if (proc_by_id(id)) { send_err(id, req_nonce, EEXIST, "diff: id in use"); return; }
  struct proc *slot = proc_by_id(0);
  if (!slot) { send_err(id, req_nonce, EAGAIN, "diff: too many processes"); return; }
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC)) { send_err(id, req_nonce, errno, "diff: pipe"); return; }
  if (pipe2(pe, O_CLOEXEC)) { send_err(id, req_nonce, errno, "diff: pipe"); close(po[0]); close(po[1]); return; }
  /* FIFREEZE writes back everything dirty first: the archive sees every completed write. */
  if (ioctl(upper_fd, FIFREEZE, 0) < 0) {
    send_err(id, req_nonce, errno, "diff: freeze the upper disk");
    close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
    return;
  }
  upper_frozen = 1;
  tar_scrub = jget(o, "scrub", 'a');
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    mac_forget();
    dup2(po[1], 1);
    dup2(pe[1], 2);
    if (fchdir(upper_fd) < 0) { fprintf(stderr, "enter the upper directory: %s\n", strerror(errno)); _exit(1); }
    /* Nothing of the agent's stays open here: a command's stdin or a port connection the agent
       closes must end now, not when the diff does. */
    syscall(SYS_close_range, 3U, ~0U, 0U);
    tar_walk("");
    tar_zeros(1024);
    _exit(0);
  }
  tar_scrub = NULL;
  close(po[1]);
  close(pe[1]);
  if (pid < 0) {
    send_err(id, req_nonce, errno, "diff: fork");
    close(po[0]); close(pe[0]);
    ioctl(upper_fd, FITHAW, 0);
    upper_frozen = 0;
    return;
  }
  fcntl(po[0], F_SETFL, O_NONBLOCK);
  fcntl(pe[0], F_SETFL, O_NONBLOCK);
  long long timeout = jnum(o, "timeoutMs", 600000);
  *slot = (struct proc){.id = id, .pid = pid, .out = po[0], .err = pe[0], .in = -1, .fd3 = -1, .credit = jnum(o, "window", -1), .thaw = 1,
                        .deadline_ms = now_ms() + (timeout > 0 ? timeout : 600000)};
  snprintf(slot->nonce, sizeof slot->nonce, "%s", req_nonce);
  char extra[64];
  snprintf(extra, sizeof extra, "\"pid\":%d", pid);
  send_ev(id, req_nonce, "started", extra, NULL, 0);
}

/* ---------- PID 1 out of every command's reach (see also confine_command) ---------------------- */

static void write_knob(const char *path, const char *val, int must) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd >= 0 && write(fd, val, strlen(val)) == (ssize_t)strlen(val)) { close(fd); return; }
  int e = errno;
  if (fd >= 0) close(fd);
  if (must) fatal("%s: %s", path, strerror(e));
  logmsg("%s: %s", path, strerror(e));
}

/* Takes `drop` out of a usermode-helper capability set (/proc/sys/kernel/usermodehelper/{bset,inheritable}). */
static void umh_drop(const char *path, uint64_t drop) {
  char cur[64];
  unsigned lo, hi;
  if (read_line(path, cur, sizeof cur) < 0 || sscanf(cur, "%u %u", &lo, &hi) != 2) fatal("read %s: %s", path, strerror(errno));
  uint64_t keep = (((uint64_t)hi << 32) | lo) & ~drop;
  char val[64];
  snprintf(val, sizeof val, "%u %u", (unsigned)(keep & 0xffffffffu), (unsigned)(keep >> 32));
  write_knob(path, val, 1);
}

/*
 * Run once, before `ready` (nothing but this process runs in the guest yet). This process holds
 * the channel and the key: a command must reach neither its memory nor its fds, nor the kernel
 * beneath it.
 * - Non-dumpable: ptrace, pidfd_getfd, process_vm_* and /proc/1/{mem,fd,environ,maps,...} then
 *   need CAP_SYS_PTRACE, which no command has (confine_command). Locked in RAM (mlockall): root
 *   in the guest may add swap, and no page of this process goes there.
 * - Yama's ptrace_scope=1 where the kernel has Yama (Debian's ships it at 0): a process attaches
 *   only to its descendants, so a command's leftovers cannot attach to (or write the memory of)
 *   a later command either. Only CAP_SYS_PTRACE may change it.
 * - No module loads and no kexec from now on (modules_disabled, kexec_load_disabled: one-way):
 *   either hands the whole kernel, and so this process's memory and the port, to a command.
 * - The kernel's usermode helpers (modprobe, core_pattern pipes, the uevent helper: root in the
 *   guest names the program, a path in the guest's root, which the kernel's threads share with
 *   this process) start without what commands lack, nor CAP_SYS_ADMIN: they run outside any
 *   command's seccomp filter.
 * - Lockdown (confidentiality, which includes integrity): no /dev/mem, no raw port I/O, no PCI BAR
 *   or config writes through sysfs (a driver of its own for the virtio-serial device), no
 *   unsigned kernel code, no debugfs writes, no bpf_probe_write_user; and nothing that reads
 *   kernel or another process's memory through the kernel: no tracefs, kprobes or uprobes, no
 *   /proc/kcore, no bpf or perf reads of kernel memory. Integrity alone left tracefs open: a
 *   command with CAP_SYS_ADMIN put a kprobe on PID 1's writes and read the MAC key's states and
 *   every frame (red team round three, second pass).
 */
static void harden_agent(void) {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fatal("PR_SET_DUMPABLE: %s", strerror(errno));
  /* ONFAULT: pages are locked as they are touched, so a buffer grown for a large request costs what it uses. */
  if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0) fatal("mlockall: %s", strerror(errno));
  if (access("/proc/sys/kernel/yama/ptrace_scope", F_OK) == 0) write_knob("/proc/sys/kernel/yama/ptrace_scope", "1", 1);
  else logmsg("no Yama in this kernel: a command may ptrace its siblings (never PID 1)");
  write_knob("/proc/sys/kernel/modules_disabled", "1", 1);
  if (access("/proc/sys/kernel/kexec_load_disabled", F_OK) == 0) write_knob("/proc/sys/kernel/kexec_load_disabled", "1", 1);
  uint64_t helpers = denied_cap_mask(0) | 1ULL << CAP_SYS_ADMIN;
  umh_drop("/proc/sys/kernel/usermodehelper/bset", helpers);
  umh_drop("/proc/sys/kernel/usermodehelper/inheritable", helpers);
  if (mount("securityfs", "/sys/kernel/security", "securityfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) fatal("mount securityfs: %s", strerror(errno));
  write_knob("/sys/kernel/security/lockdown", "confidentiality", 1);
}

/* ---------- the request loop ------------------------------------------------------------ */

static char *inbuf;
static size_t inlen, incap;

/* A nonce as the edge makes them: lowercase hex, 16..64 digits (it goes into headers verbatim). */
static int nonce_ok(const char *n) {
  size_t len = strlen(n);
  if (len < 16 || len > NONCE_MAX) return 0;
  for (const char *p = n; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  return 1;
}

/* Parses 64 hex digits into 32 bytes; 0 when the string is not that. */
static int hex32(const char *s, unsigned char out[32]) {
  if (!s || strlen(s) != 64) return 0;
  for (int i = 0; i < 32; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return 0;
    out[i] = (unsigned char)v;
  }
  return 1;
}

/*
 * What makes a guest restored from a saved state its own (`timeMs`, `seed`, given with `key` or
 * `renew`): every guest restored from one image's snapshot wakes up with the same kernel RNG state
 * and the clock of the moment it was saved. The seed (32 bytes the edge drew for this VM) is
 * mixed into the kernel's pool and the RNG reseeded at once (RNDRESEEDCRNG), so no two siblings
 * draw the same bytes from then on; the wall clock is set to the edge's. Returns 0, or an errno
 * with `why` set.
 */
static int apply_identity(struct jobj *o, const char **why) {
  struct jval *seed = jget(o, "seed", 's');
  if (seed) {
    struct { struct rand_pool_info info; unsigned char buf[32]; } pool = {.info = {.entropy_count = 256, .buf_size = 32}};
    int ok = hex32(seed->str, pool.buf);
    explicit_bzero(seed->str, strlen(seed->str));
    if (!ok) { *why = "seed: 64 hex digits expected"; return EINVAL; }
    int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    int err = fd < 0 || ioctl(fd, RNDADDENTROPY, &pool) < 0 || ioctl(fd, RNDRESEEDCRNG) < 0 ? errno : 0;
    explicit_bzero(&pool, sizeof pool);
    if (fd >= 0) close(fd);
    if (err) { *why = "seed: the kernel refused it"; return err; }
  }
  long long ms = jnum(o, "timeMs", -1);
  if (ms >= 0) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0) { *why = "timeMs: clock_settime failed"; return errno; }
  }
  return 0;
}

/*
 * `renew` {timeMs, seed}: apply_identity for a guest that has its key already (restored from a
 * fork's snapshot, which keeps its source's key).
 */
static void op_renew(long long id, struct jobj *o) {
  const char *why = NULL;
  int err = apply_identity(o, &why);
  if (err) send_err(id, req_nonce, err, why);
  else send_ev(id, req_nonce, "ok", NULL, NULL, 0);
}

/*
 * `key` {key: 64 hex digits, timeMs?, seed?}: the channel's MAC key (see mac_set_key), once per
 * boot; the answer is the first frame with a MAC. A restored guest keeps the key it was saved
 * with; a guest restored from an image's snapshot (saved before it had one) takes its own here,
 * with its own clock and RNG seed (apply_identity).
 */
static void op_key(long long id, struct jobj *o) {
  struct jval *k = jget(o, "key", 's');
  unsigned char key[32];
  int ok = k && strlen(k->str) == 64;
  for (int i = 0; ok && i < 32; i++) {
    unsigned v;
    ok = sscanf(k->str + 2 * i, "%2x", &v) == 1;
    key[i] = (unsigned char)v;
  }
  if (k) explicit_bzero(k->str, strlen(k->str));
  if (have_key) { explicit_bzero(key, sizeof key); send_err(id, req_nonce, EEXIST, "key: the channel has its key already"); return; }
  if (!ok) { explicit_bzero(key, sizeof key); send_err(id, req_nonce, EINVAL, "key: 64 hex digits expected"); return; }
  const char *why = NULL;
  int err = apply_identity(o, &why);
  if (err) { explicit_bzero(key, sizeof key); send_err(id, req_nonce, err, why); return; }
  mac_set_key(key);
  explicit_bzero(key, sizeof key);
  send_ev(id, req_nonce, "ok", NULL, NULL, 0);
}

static void handle(const char *header, const char *payload, size_t plen) {
  struct jobj o;
  if (jobj_parse(header, &o) < 0) { logmsg("bad request header"); jobj_free(&o); return; }
  long long id = jnum(&o, "id", -1);
  const char *op = jstr(&o, "op");
  const char *nonce = jstr(&o, "nonce");
  if (id < 1 || !op) { logmsg("request without id or op"); jobj_free(&o); return; }
  if (nonce && !nonce_ok(nonce)) { send_err(id, NULL, EINVAL, "nonce: 16 to 64 lowercase hex digits expected"); jobj_free(&o); return; }
  req_nonce = nonce ? nonce : "";
  if (!strcmp(op, "key")) op_key(id, &o);
  else if (!have_key) send_err(id, req_nonce, EACCES, "the edge has not given the channel's key yet");
  else if (!strcmp(op, "exec")) op_exec(id, &o);
  else if (!strcmp(op, "stdin")) op_stdin(id, &o, payload, plen);
  else if (!strcmp(op, "signal")) op_signal(id, &o);
  else if (!strcmp(op, "resize")) op_resize(id, &o);
  else if (!strcmp(op, "read")) jstr(&o, "path") ? op_read(id, jstr(&o, "path"), jnum(&o, "max", MAX_PAYLOAD)) : send_err(id, req_nonce, EINVAL, "path is missing");
  else if (!strcmp(op, "write") && upper_frozen) send_err(id, req_nonce, EBUSY, "the disk is frozen while a snapshot reads it; retry when the snapshot ends");
  else if (!strcmp(op, "write")) jstr(&o, "path") ? op_write(id, jstr(&o, "path"), jnum(&o, "mode", 0644), payload, plen) : send_err(id, req_nonce, EINVAL, "path is missing");
  else if (!strcmp(op, "stat")) jstr(&o, "path") ? op_stat(id, jstr(&o, "path")) : send_err(id, req_nonce, EINVAL, "path is missing");
  else if (!strcmp(op, "list")) jstr(&o, "path") ? op_list(id, jstr(&o, "path"), jnum(&o, "max", 10000)) : send_err(id, req_nonce, EINVAL, "path is missing");
  else if (!strcmp(op, "renew")) op_renew(id, &o);
  else if (!strcmp(op, "ping")) send_ev(id, req_nonce, "ok", NULL, NULL, 0);
  else if (!strcmp(op, "kill_group")) op_kill_group(id, &o);
  else if (!strcmp(op, "connect")) op_connect(id, &o);
  else if (!strcmp(op, "send")) op_send(id, &o, payload, plen);
  else if (!strcmp(op, "close")) op_close(id);
  else if (!strcmp(op, "credit")) op_credit(id, &o);
  else if (!strcmp(op, "diff")) op_diff(id, &o);
  else if (upper_frozen && (!strcmp(op, "mkdir") || !strcmp(op, "remove") || !strcmp(op, "rename") || !strcmp(op, "sync")))
    send_err(id, req_nonce, EBUSY, "the disk is frozen while a snapshot reads it; retry when the snapshot ends"); /* the agent must never block on it */
  else op_fs(id, op, &o);
  req_nonce = "";
  jobj_free(&o);
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void port_readable(void) {
  for (;;) {
    if (incap - inlen < CHUNK) {
      incap = incap ? incap * 2 : 4 * CHUNK;
      inbuf = realloc(inbuf, incap);
      if (!inbuf) fatal("out of memory");
    }
    ssize_t r = read(port_fd, inbuf + inlen, incap - inlen);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break; /* EAGAIN, or no host end connected (the edge restarts): wait for more */
    inlen += (size_t)r;
  }
  size_t off = 0;
  while (inlen - off >= 8) {
    const unsigned char *p = (const unsigned char *)inbuf + off;
    uint32_t hl = be32(p), pl = be32(p + 4);
    if (hl == 0 || hl > MAX_HEADER || pl > MAX_PAYLOAD) fatal("bad frame from the edge (header %u, payload %u)", hl, pl);
    if (inlen - off < 8 + (size_t)hl + pl) break;
    char *h = malloc(hl + 1);
    if (!h) fatal("out of memory");
    memcpy(h, p + 8, hl);
    h[hl] = 0;
    handle(h, (const char *)p + 8 + hl, pl);
    /* A request's header is not kept in memory a child inherits (the key came in one). */
    explicit_bzero(h, hl);
    explicit_bzero(inbuf + off + 8, hl);
    free(h);
    off += 8 + (size_t)hl + pl;
  }
  memmove(inbuf, inbuf + off, inlen - off);
  inlen -= off;
}

int main(void) {
  if (getpid() != 1) {
    fprintf(stderr, "dsec-vm-agent runs as PID 1 of a dsec guest (the initramfs's /init)\n");
    return 2;
  }
  setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
  boot();
  port_fd = open_port();
  harden_agent();

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  sigdelset(&mask, SIGPIPE);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) fatal("signalfd: %s", strerror(errno));

  send_ev(0, NULL, "ready", NULL, NULL, 0);
  logmsg("ready");

  static struct pollfd pfds[2 + 4 * MAX_PROCS + MAX_CONNS];
  static struct proc *owner[2 + 4 * MAX_PROCS + MAX_CONNS];
  static struct conn *conn_owner[2 + 4 * MAX_PROCS + MAX_CONNS];
  for (;;) {
    int n = 0;
    pfds[n++] = (struct pollfd){.fd = port_fd, .events = POLLIN};
    pfds[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    for (int i = 0; i < MAX_PROCS; i++) {
      if (!procs[i].id) continue;
      if (procs[i].out >= 0 && procs[i].credit != 0) { owner[n] = &procs[i]; pfds[n++] = (struct pollfd){.fd = procs[i].out, .events = POLLIN}; }
      if (procs[i].err >= 0 && procs[i].credit != 0) { owner[n] = &procs[i]; pfds[n++] = (struct pollfd){.fd = procs[i].err, .events = POLLIN}; }
      if (procs[i].fd3 >= 0) { owner[n] = &procs[i]; pfds[n++] = (struct pollfd){.fd = procs[i].fd3, .events = POLLIN}; }
      if (procs[i].in >= 0 && procs[i].in_len) { owner[n] = &procs[i]; pfds[n++] = (struct pollfd){.fd = procs[i].in, .events = POLLOUT}; }
    }
    int first_conn = n;
    for (int i = 0; i < MAX_CONNS; i++)
      if (conns[i].id) {
        short events = (short)((!conns[i].eof && conns[i].credit != 0 ? POLLIN : 0) | (conns[i].pend_len ? POLLOUT : 0));
        if (events) { conn_owner[n] = &conns[i]; pfds[n++] = (struct pollfd){.fd = conns[i].fd, .events = events}; }
      }
    /* With no host end connected the port polls as hung up; sleep rather than spin. */
    int r = poll(pfds, (nfds_t)n, 1000);
    long long now = now_ms();
    for (int i = 0; i < MAX_PROCS; i++)
      if (procs[i].id && procs[i].deadline_ms && now >= procs[i].deadline_ms) {
        kill(procs[i].pid, SIGKILL);
        procs[i].deadline_ms = 0;
      }
    if (r < 0) continue;
    if (r == 0 || (pfds[0].revents & (POLLHUP | POLLERR | POLLNVAL))) port_check();
    if (pfds[0].revents & POLLIN) port_readable();
    else if (pfds[0].revents & POLLHUP) {
      /* The edge is gone (restarting): a diff has no reader any more, and the disk must not
         stay frozen until its deadline. */
      for (int i = 0; i < MAX_PROCS; i++)
        if (procs[i].id && procs[i].thaw) kill(procs[i].pid, SIGKILL);
      msleep(50);
    }
    for (int i = 2; i < first_conn; i++) {
      if (!pfds[i].revents) continue;
      struct proc *p = owner[i];
      if (!p->id) continue;
      if (pfds[i].fd == p->out) drain(p, &p->out, "stdout");
      else if (pfds[i].fd == p->err) drain(p, &p->err, "stderr");
      else if (pfds[i].fd == p->fd3) drain(p, &p->fd3, "fd3");
      else if (pfds[i].fd == p->in) stdin_flush(p);
    }
    for (int i = first_conn; i < n; i++) {
      struct conn *c = conn_owner[i];
      if (!pfds[i].revents || !c->id || c->fd != pfds[i].fd) continue;
      if (c->pend_len && (pfds[i].revents & (POLLOUT | POLLERR | POLLHUP))) conn_flush(c);
      if ((pfds[i].events & POLLIN) && (pfds[i].revents & ~POLLOUT) && !c->eof) conn_readable(c);
    }
    if (pfds[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {}
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reaped(pid, status);
    }
  }
}
