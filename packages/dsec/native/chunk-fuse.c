/*
 * dsec-chunk-fuse: the node's lazy layer store. A read-only FUSE file system that shows each layer
 * blob as `<hex>.erofs`; the blob's chunks are fetched on first read from the blob store over HTTP
 * range requests, checked against the per-chunk sha256 list recorded when the layer was made, and
 * kept in a node-local chunk cache shared by every mount of the layer. EROFS mounts the file
 * (file-backed), so the kernel's page cache sits above it and a chunk is fetched once per node.
 *
 *   dsec-chunk-fuse --cache DIR [--retries N] [--attempt-timeout-ms N] [--connect-timeout-ms N] MOUNTPOINT
 *
 * The edge writes, per blob, `DIR/<hex>/index` (text: "dsec-chunks 1", "size N", "chunk N", then one
 * hex sha256 per chunk) and, optionally, `DIR/<hex>/prefetch` (chunk numbers, one a line), and reads
 * back `DIR/stats` (per blob: bytes and chunks fetched, failed fetches, digest mismatches, bytes and chunks
 * read, bytes prefetched; per sandbox: bytes and chunks it read first on the node) and
 * `DIR/<hex>/touched` (chunks read through the mount, in first-read order: the prefetch list of the
 * next node). Chunks live at `DIR/<hex>/c<N>`; the edge may delete them to evict (they are fetched
 * again on the next read). The blob store is named in `DIR/source` (mode 0600: its base URL on the
 * first line, its bearer token on the second; never argv, which any user can read in /proc), read
 * again whenever the file changes, so a restarted edge whose store moved (a new port) redirects a
 * daemon it adopted.
 *
 * Faults are bounded: a chunk is tried `--retries` times, each attempt capped in time, then the
 * reader gets EIO; a chunk whose digest does not match is refused and fetched again. Concurrent
 * first reads of one chunk wait on one fetch and share its outcome.
 */
#define FUSE_USE_VERSION 35
#define _GNU_SOURCE
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct blob {
	char hex[65];
	uint64_t size;
	uint32_t chunk_size;
	uint32_t nchunks;
	unsigned char (*digests)[32];
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint8_t *inflight;
	uint8_t *touched;
	uint32_t *failures; /* per chunk: completed failed fetches, so waiters learn the outcome */
	uint64_t fetched_bytes, fetched_chunks, failed_fetches, mismatches;
	/* Chunks read through the mount (each once): what the node's workloads needed. Unlike the
	 * fetched counts, this does not depend on whether the prefetcher or a reader got a chunk first. */
	uint64_t read_bytes, read_chunks;
	uint64_t prefetched_bytes; /* fetched by the prefetcher, read or not */
	struct blob *next;
};

/* Chunks one sandbox read first on the node (the cgroup of the first process to read each). */
struct sandbox_stat {
	char id[96];
	uint64_t bytes, chunks;
	struct sandbox_stat *next;
};

static struct {
	const char *cache;
	struct sandbox_stat *sandboxes; /* under mu */
	pthread_mutex_t src_mu; /* url, auth_header and the source file's identity */
	char url[2048];
	char auth_header[2048];
	struct timespec src_mtime;
	off_t src_size;
	int retries;
	long attempt_timeout_ms;
	long connect_timeout_ms;
	pthread_mutex_t mu; /* blobs list and the stats file */
	struct blob *blobs;
	pthread_key_t curl_key;
} g = { .retries = 3, .attempt_timeout_ms = 15000, .connect_timeout_ms = 2000, .mu = PTHREAD_MUTEX_INITIALIZER, .src_mu = PTHREAD_MUTEX_INITIALIZER };

static void logf_(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "dsec-chunk-fuse: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int is_hex64(const char *s, size_t n) {
	if (n != 64) return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
	return 1;
}

static int parse_hex32(const char *s, unsigned char out[32]) {
	for (int i = 0; i < 32; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
		out[i] = (unsigned char)v;
	}
	return 0;
}

/* `/<hex>.erofs` → hex, or NULL. */
static int hex_of_path(const char *path, char hex[65]) {
	if (path[0] != '/') return -1;
	const char *name = path + 1;
	size_t n = strlen(name);
	if (n != 64 + 6 || strcmp(name + 64, ".erofs") != 0 || !is_hex64(name, 64)) return -1;
	memcpy(hex, name, 64);
	hex[64] = 0;
	return 0;
}

static void write_stats_locked(void) {
	char tmp[4096], dst[4096];
	snprintf(tmp, sizeof tmp, "%s/.stats.tmp", g.cache);
	snprintf(dst, sizeof dst, "%s/stats", g.cache);
	FILE *f = fopen(tmp, "w");
	if (!f) return;
	for (struct blob *b = g.blobs; b; b = b->next) {
		pthread_mutex_lock(&b->mu);
		fprintf(f, "%s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", b->hex, b->fetched_bytes,
			b->fetched_chunks, b->failed_fetches, b->mismatches, b->read_bytes, b->read_chunks, b->prefetched_bytes);
		pthread_mutex_unlock(&b->mu);
	}
	for (struct sandbox_stat *s = g.sandboxes; s; s = s->next) fprintf(f, "sandbox %s %" PRIu64 " %" PRIu64 "\n", s->id, s->bytes, s->chunks);
	if (fclose(f) == 0) rename(tmp, dst);
}

static void write_stats(void) {
	pthread_mutex_lock(&g.mu);
	write_stats_locked();
	pthread_mutex_unlock(&g.mu);
}

/* The dsec sandbox a process belongs to (its cgroup dsec/<sandbox id>), or "" for the node's own. */
static void sandbox_of(pid_t pid, char *out, size_t n) {
	out[0] = 0;
	if (pid <= 0) return;
	char path[64], line[1024];
	snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f) return;
	while (fgets(line, sizeof line, f)) {
		char *p = strstr(line, ":/dsec/sb-");
		if (!p) continue;
		p += strlen(":/dsec/");
		p[strcspn(p, "/\n")] = 0;
		snprintf(out, n, "%s", p);
		break;
	}
	fclose(f);
}

/* Counts a chunk against the sandbox whose process read it first on the node. */
static void charge_sandbox(pid_t pid, uint64_t bytes) {
	char id[96];
	sandbox_of(pid, id, sizeof id);
	if (!id[0]) return;
	pthread_mutex_lock(&g.mu);
	struct sandbox_stat *s;
	for (s = g.sandboxes; s; s = s->next)
		if (strcmp(s->id, id) == 0) break;
	if (!s && (s = calloc(1, sizeof *s))) {
		snprintf(s->id, sizeof s->id, "%s", id);
		s->next = g.sandboxes;
		g.sandboxes = s;
	}
	if (s) {
		s->bytes += bytes;
		s->chunks++;
	}
	pthread_mutex_unlock(&g.mu);
}

static void *prefetch_main(void *arg);

/* Reads DIR/<hex>/index; NULL (errno set) when absent or malformed. */
static struct blob *load_blob(const char *hex) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s/index", g.cache, hex);
	FILE *f = fopen(path, "r");
	if (!f) return NULL;
	struct blob *b = calloc(1, sizeof *b);
	char line[256];
	unsigned long long size = 0, chunk = 0;
	int ok = fgets(line, sizeof line, f) && strcmp(line, "dsec-chunks 1\n") == 0 && fgets(line, sizeof line, f) &&
		 sscanf(line, "size %llu", &size) == 1 && fgets(line, sizeof line, f) && sscanf(line, "chunk %llu", &chunk) == 1 &&
		 chunk >= 4096 && chunk <= (1ull << 30);
	if (ok) {
		b->size = size;
		b->chunk_size = (uint32_t)chunk;
		b->nchunks = (uint32_t)((size + chunk - 1) / chunk);
		b->digests = calloc(b->nchunks ? b->nchunks : 1, 32);
		for (uint32_t i = 0; ok && i < b->nchunks; i++) {
			ok = fgets(line, sizeof line, f) && strlen(line) >= 64 && is_hex64(line, 64) && parse_hex32(line, b->digests[i]) == 0;
		}
	}
	fclose(f);
	if (!ok) {
		logf_("%s: malformed chunk index", path);
		free(b->digests);
		free(b);
		errno = EIO;
		return NULL;
	}
	memcpy(b->hex, hex, 65);
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	b->inflight = calloc(b->nchunks + 1, 1);
	b->touched = calloc(b->nchunks + 1, 1);
	b->failures = calloc(b->nchunks + 1, sizeof(uint32_t));
	return b;
}

static struct blob *get_blob(const char *hex) {
	pthread_mutex_lock(&g.mu);
	struct blob *b;
	for (b = g.blobs; b; b = b->next)
		if (strcmp(b->hex, hex) == 0) break;
	int fresh = 0;
	if (!b) {
		b = load_blob(hex);
		if (b) {
			b->next = g.blobs;
			g.blobs = b;
			fresh = 1;
		}
	}
	pthread_mutex_unlock(&g.mu);
	if (fresh) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s/prefetch", g.cache, hex);
		if (access(path, R_OK) == 0) {
			pthread_t t;
			pthread_attr_t a;
			pthread_attr_init(&a);
			pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&t, &a, prefetch_main, b) != 0) logf_("%s: no prefetch thread", hex);
			pthread_attr_destroy(&a);
		}
	}
	return b;
}

/* --- HTTP -------------------------------------------------------------------------------------- */

/* Copies the store's URL and Authorization header, rereading DIR/source if it changed; -1 if none. */
static int current_source(char *url, size_t urllen, char *auth, size_t authlen) {
	char path[4096];
	snprintf(path, sizeof path, "%s/source", g.cache);
	struct stat st;
	pthread_mutex_lock(&g.src_mu);
	if (stat(path, &st) == 0 && (st.st_mtim.tv_sec != g.src_mtime.tv_sec || st.st_mtim.tv_nsec != g.src_mtime.tv_nsec || st.st_size != g.src_size)) {
		FILE *f = fopen(path, "r");
		char u[2048] = "", t[1900] = "";
		if (f) {
			if (fgets(u, sizeof u, f) && fgets(t, sizeof t, f)) { /* both lines, or keep the old source */ }
			fclose(f);
			u[strcspn(u, "\n")] = 0;
			t[strcspn(t, "\n")] = 0;
			if (u[0]) {
				snprintf(g.url, sizeof g.url, "%s", u);
				if (t[0]) snprintf(g.auth_header, sizeof g.auth_header, "Authorization: Bearer %s", t);
				else g.auth_header[0] = 0;
				g.src_mtime = st.st_mtim;
				g.src_size = st.st_size;
			}
		}
	}
	int ok = g.url[0] != 0;
	snprintf(url, urllen, "%s", g.url);
	snprintf(auth, authlen, "%s", g.auth_header);
	pthread_mutex_unlock(&g.src_mu);
	return ok ? 0 : -1;
}

struct sink {
	unsigned char *buf;
	size_t want, got;
};

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
	struct sink *s = arg;
	size_t len = sz * n;
	if (s->got + len > s->want) return 0; /* more than the range asked for: abort the transfer */
	memcpy(s->buf + s->got, p, len);
	s->got += len;
	return len;
}

static void free_curl(void *h) {
	curl_easy_cleanup(h);
}

/* One handle per FUSE worker thread, so connections to the store are reused. */
static CURL *thread_curl(void) {
	CURL *h = pthread_getspecific(g.curl_key);
	if (!h) {
		h = curl_easy_init();
		pthread_setspecific(g.curl_key, h);
	}
	return h;
}

/* One attempt; 0 when exactly `want` bytes of the range arrived. */
static int fetch_range(const char *hex, uint64_t off, unsigned char *buf, size_t want, char *err, size_t errlen) {
	CURL *h = thread_curl();
	if (!h) {
		snprintf(err, errlen, "curl_easy_init failed");
		return -1;
	}
	curl_easy_reset(h);
	char base[2048], auth[2048], url[4096], range[64];
	if (current_source(base, sizeof base, auth, sizeof auth) != 0) {
		snprintf(err, errlen, "no blob store named in %s/source", g.cache);
		return -1;
	}
	snprintf(url, sizeof url, "%s/v1/blobs/sha256:%s", base, hex);
	snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, off, off + want - 1);
	struct curl_slist *hdrs = NULL;
	if (auth[0]) hdrs = curl_slist_append(hdrs, auth);
	struct sink s = { buf, want, 0 };
	char cerr[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_RANGE, range);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, g.connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, g.attempt_timeout_ms);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	CURLcode rc = curl_easy_perform(h);
	long status = 0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(hdrs);
	if (rc != CURLE_OK) {
		snprintf(err, errlen, "%s", cerr[0] ? cerr : curl_easy_strerror(rc));
		return -1;
	}
	if (status != 206 && !(status == 200 && off == 0)) {
		snprintf(err, errlen, "HTTP %ld", status);
		return -1;
	}
	if (s.got != want) {
		snprintf(err, errlen, "short body: %zu of %zu bytes", s.got, want);
		return -1;
	}
	return 0;
}

/* --- chunks ------------------------------------------------------------------------------------ */

static uint64_t chunk_len(const struct blob *b, uint32_t i) {
	uint64_t off = (uint64_t)i * b->chunk_size;
	return b->size - off < b->chunk_size ? b->size - off : b->chunk_size;
}

static void chunk_path(const struct blob *b, uint32_t i, char *out, size_t n) {
	snprintf(out, n, "%s/%s/c%" PRIu32, g.cache, b->hex, i);
}

/* Fetches chunk i with bounded retries, verifies it and renames it into the cache; 0 or -EIO. */
static int fetch_chunk(struct blob *b, uint32_t i, pid_t reader) {
	size_t len = chunk_len(b, i);
	uint64_t off = (uint64_t)i * b->chunk_size;
	unsigned char *buf = malloc(len ? len : 1);
	if (!buf) return -EIO;
	char err[CURL_ERROR_SIZE + 64] = "";
	int ok = 0;
	for (int attempt = 0; attempt < g.retries && !ok; attempt++) {
		if (attempt > 0) {
			long ms = 100L << (attempt - 1);
			if (ms > 2000) ms = 2000;
			struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
		if (fetch_range(b->hex, off, buf, len, err, sizeof err) != 0) {
			logf_("sha256:%s chunk %" PRIu32 " attempt %d: %s", b->hex, i, attempt + 1, err);
			continue;
		}
		unsigned char md[32];
		unsigned int mdlen = 0;
		if (!EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL) || memcmp(md, b->digests[i], 32) != 0) {
			pthread_mutex_lock(&b->mu);
			b->mismatches++;
			pthread_mutex_unlock(&b->mu);
			snprintf(err, sizeof err, "digest mismatch");
			logf_("sha256:%s chunk %" PRIu32 " attempt %d: digest mismatch, refused", b->hex, i, attempt + 1);
			continue;
		}
		ok = 1;
	}
	int rc = -EIO;
	if (ok) {
		char dir[4096], tmp[4200], dst[4200];
		snprintf(dir, sizeof dir, "%s/%s", g.cache, b->hex);
		mkdir(dir, 0700); /* the edge may have evicted the whole directory */
		snprintf(tmp, sizeof tmp, "%s/.c%" PRIu32 ".tmp", dir, i);
		chunk_path(b, i, dst, sizeof dst);
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		size_t done = 0;
		while (fd >= 0 && done < len) {
			ssize_t w = write(fd, buf + done, len - done);
			if (w <= 0) break;
			done += (size_t)w;
		}
		if (fd >= 0 && close(fd) == 0 && done == len && rename(tmp, dst) == 0) rc = 0;
		else {
			logf_("sha256:%s chunk %" PRIu32 ": cannot store in %s: %s", b->hex, i, dir, strerror(errno));
			unlink(tmp);
		}
	}
	free(buf);
	pthread_mutex_lock(&b->mu);
	if (rc == 0) {
		b->fetched_bytes += len;
		b->fetched_chunks++;
		if (reader == 0) b->prefetched_bytes += len;
	} else {
		b->failed_fetches++;
	}
	pthread_mutex_unlock(&b->mu);
	write_stats();
	return rc;
}

/* A chunk read through the mount: its first read counts (blob and sandbox) and joins the trace. */
static void record_touch(struct blob *b, uint32_t i, pid_t reader) {
	pthread_mutex_lock(&b->mu);
	int first = !b->touched[i];
	b->touched[i] = 1;
	if (first) {
		b->read_bytes += chunk_len(b, i);
		b->read_chunks++;
	}
	pthread_mutex_unlock(&b->mu);
	if (!first) return;
	charge_sandbox(reader, chunk_len(b, i));
	write_stats();
	char path[4096], line[32];
	snprintf(path, sizeof path, "%s/%s/touched", g.cache, b->hex);
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) return;
	int n = snprintf(line, sizeof line, "%" PRIu32 "\n", i);
	if (write(fd, line, (size_t)n) != n) logf_("%s: short write", path);
	close(fd);
}

/* An open fd of chunk i, fetching it first if it is not cached; -errno on failure. */
static int open_chunk(struct blob *b, uint32_t i, pid_t reader) {
	char path[4200];
	chunk_path(b, i, path, sizeof path);
	for (;;) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) return fd;
		pthread_mutex_lock(&b->mu);
		if (b->inflight[i]) {
			/* Another reader fetches it: wait, and share its outcome rather than retry again. */
			uint32_t before = b->failures[i];
			while (b->inflight[i]) pthread_cond_wait(&b->cv, &b->mu);
			int failed = b->failures[i] != before;
			pthread_mutex_unlock(&b->mu);
			if (failed) return -EIO;
			continue;
		}
		b->inflight[i] = 1;
		pthread_mutex_unlock(&b->mu);
		fd = open(path, O_RDONLY | O_CLOEXEC); /* finished between our open and the lock */
		int rc = fd >= 0 ? 0 : fetch_chunk(b, i, reader);
		pthread_mutex_lock(&b->mu);
		b->inflight[i] = 0;
		if (rc != 0) b->failures[i]++;
		pthread_cond_broadcast(&b->cv);
		pthread_mutex_unlock(&b->mu);
		if (rc != 0) return rc;
		if (fd >= 0) return fd;
	}
}

/*
 * Fetches running at once for one blob's prefetch list. One at a time left the trace behind the
 * sandbox it was meant to lead (each chunk waits a round trip); four keep ahead of it on a loopback
 * store while leaving the FUSE threads' own fetches a share of the link.
 */
#define PREFETCH_WORKERS 4

struct prefetch {
	struct blob *b;
	uint32_t *list;
	size_t len;
	size_t next; /* atomic: the list entry the next free worker takes */
	unsigned done; /* atomic */
};

static void *prefetch_worker(void *arg) {
	struct prefetch *p = arg;
	for (;;) {
		size_t k = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
		if (k >= p->len) return NULL;
		int fd = open_chunk(p->b, p->list[k], 0);
		if (fd >= 0) {
			close(fd);
			__atomic_fetch_add(&p->done, 1, __ATOMIC_RELAXED);
		}
	}
}

/* Reads DIR/<hex>/prefetch (chunk numbers in first-read order; it stops at the first non-number) and fetches them. */
static void *prefetch_main(void *arg) {
	struct blob *b = arg;
	char path[4096];
	snprintf(path, sizeof path, "%s/%s/prefetch", g.cache, b->hex);
	FILE *f = fopen(path, "r");
	if (!f) return NULL;
	struct prefetch p = { .b = b, .list = calloc(b->nchunks + 1, sizeof(uint32_t)) };
	unsigned long i;
	while (p.list && p.len < b->nchunks && fscanf(f, "%lu", &i) == 1)
		if (i < b->nchunks) p.list[p.len++] = (uint32_t)i;
	fclose(f);
	pthread_t workers[PREFETCH_WORKERS];
	int started = 0;
	for (; started < PREFETCH_WORKERS && (size_t)started < p.len; started++)
		if (pthread_create(&workers[started], NULL, prefetch_worker, &p) != 0) break;
	if (started == 0) prefetch_worker(&p); /* no thread to spare: fetch them here */
	for (int w = 0; w < started; w++) pthread_join(workers[w], NULL);
	logf_("sha256:%s: prefetched %u of %zu chunks", b->hex, p.done, p.len);
	free(p.list);
	return NULL;
}

/* --- FUSE operations --------------------------------------------------------------------------- */

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
	(void)conn;
	cfg->kernel_cache = 1; /* blobs never change: keep their pages across opens */
	cfg->entry_timeout = 3600;
	cfg->attr_timeout = 3600;
	cfg->negative_timeout = 0; /* a blob's index may be written at any moment */
	return NULL;
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
	(void)fi;
	memset(st, 0, sizeof *st);
	if (strcmp(path, "/") == 0) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
		return 0;
	}
	char hex[65];
	if (hex_of_path(path, hex) != 0) return -ENOENT;
	struct blob *b = get_blob(hex);
	if (!b) return errno == EIO ? -EIO : -ENOENT;
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_size = (off_t)b->size;
	st->st_blksize = 4096;
	st->st_blocks = (blkcnt_t)((b->size + 511) / 512);
	return 0;
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags) {
	(void)off;
	(void)fi;
	(void)flags;
	if (strcmp(path, "/") != 0) return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	DIR *d = opendir(g.cache);
	if (!d) return 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!is_hex64(e->d_name, strlen(e->d_name))) continue;
		char idx[4096], name[80];
		snprintf(idx, sizeof idx, "%s/%s/index", g.cache, e->d_name);
		if (access(idx, R_OK) != 0) continue;
		snprintf(name, sizeof name, "%s.erofs", e->d_name);
		fill(buf, name, NULL, 0, 0);
	}
	closedir(d);
	return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi) {
	char hex[65];
	if (hex_of_path(path, hex) != 0) return -ENOENT;
	if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
	struct blob *b = get_blob(hex);
	if (!b) return -ENOENT;
	fi->fh = (uint64_t)(uintptr_t)b;
	fi->keep_cache = 1;
	return 0;
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
	(void)path;
	struct blob *b = (struct blob *)(uintptr_t)fi->fh;
	if (off < 0) return -EINVAL;
	if ((uint64_t)off >= b->size) return 0;
	if ((uint64_t)off + size > b->size) size = (size_t)(b->size - (uint64_t)off);
	size_t done = 0;
	while (done < size) {
		uint64_t pos = (uint64_t)off + done;
		uint32_t i = (uint32_t)(pos / b->chunk_size);
		uint64_t in = pos - (uint64_t)i * b->chunk_size;
		size_t n = size - done;
		if (n > chunk_len(b, i) - in) n = (size_t)(chunk_len(b, i) - in);
		/* Never a short read on failure: the kernel would take it for the end of the file,
		 * zero-fill the rest of the pages and shrink the file's size. */
		pid_t reader = fuse_get_context()->pid;
		int fd = open_chunk(b, i, reader);
		if (fd < 0) return fd;
		record_touch(b, i, reader);
		ssize_t r = pread(fd, buf + done, n, (off_t)in);
		close(fd);
		if (r != (ssize_t)n) {
			logf_("sha256:%s chunk %" PRIu32 ": cached chunk is short", b->hex, i);
			return -EIO;
		}
		done += n;
	}
	return (int)done;
}

static const struct fuse_operations ops = {
	.init = op_init,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
};

static void usage(void) {
	fprintf(stderr, "usage: dsec-chunk-fuse --cache DIR [--retries N] [--attempt-timeout-ms N] "
			"[--connect-timeout-ms N] MOUNTPOINT\n");
	exit(2);
}

int main(int argc, char **argv) {
	const char *mnt = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--cache") == 0 && v) g.cache = v, i++;
		else if (strcmp(a, "--retries") == 0 && v) g.retries = atoi(v), i++;
		else if (strcmp(a, "--attempt-timeout-ms") == 0 && v) g.attempt_timeout_ms = atol(v), i++;
		else if (strcmp(a, "--connect-timeout-ms") == 0 && v) g.connect_timeout_ms = atol(v), i++;
		else if (a[0] != '-' && !mnt) mnt = a;
		else usage();
	}
	if (!g.cache || !mnt || g.retries < 1 || g.attempt_timeout_ms < 1 || g.connect_timeout_ms < 1) usage();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
		logf_("curl_global_init failed");
		return 1;
	}
	pthread_key_create(&g.curl_key, free_curl);
	char *fargv[] = { argv[0], "-f", "-o", "ro,allow_other,fsname=dsec-chunks,subtype=dsec-chunks", (char *)mnt, NULL };
	int rc = fuse_main(5, fargv, &ops, NULL);
	curl_global_cleanup();
	return rc;
}
