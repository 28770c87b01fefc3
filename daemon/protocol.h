/*
 * protocol.h: the metal_runner wire protocol, version 1, as C structs.
 *
 * protocol.md is the specification; this file is its C form. Every integer on
 * the wire is little-endian. Each struct below is naturally aligned and lists
 * its padding explicitly, so on a little-endian host its memory layout is
 * exactly its wire layout (tests/test_protocol_layout.py checks this with
 * cffi against the Python codec). No struct is packed.
 *
 * A frame is a header followed by the message's fixed fields and then, for
 * some messages, variable-length data whose length is a field of the fixed
 * part. hdr.size counts the whole frame, header included.
 *
 * This file must stay parseable by cffi's cdef after preprocessor lines other
 * than "#define NAME <integer literal>" are removed: no expressions in
 * defines, no macros in declarations.
 */
#ifndef METAL_RUNNER_PROTOCOL_H
#define METAL_RUNNER_PROTOCOL_H

#include <stdint.h>

#define PROTO_MAGIC 0x524c544d		/* the bytes "MTLR" */
#define PROTO_VERSION 1
#define PROTO_HDR_SIZE 12
#define PROTO_MIN_MAXMSG 65536		/* a peer may not ask for less */
#define PROTO_DEFAULT_MAXMSG 67108864	/* 64 MiB per frame */
#define PROTO_MAX_ARGS 63		/* buffers + values per kernel */
#define PROTO_MAX_NAME 255		/* kernel name length in Tload */
#define PROTO_MAX_ERRTEXT 1024		/* Rerror text length */
/* A compiler's whole output (EPROGRAM for Metal source): what fits a frame
 * of the smallest maxmsg. */
#define PROTO_MAX_COMPILER_TEXT (PROTO_MIN_MAXMSG - 20)
#define PROTO_NONCE_SIZE 32
#define PROTO_MAC_SIZE 32
#define PROTO_NO_CORE 65535		/* Tload.corearg: no core_id argument */
#define PROTO_PROFILE_RECORDS 65536	/* records a session's profile holds */
#define PROTO_HASH_SIZE 32		/* a SHA-256, the cache's content name */
#define PROTO_CACHE_PINS 4096		/* cached contents a session keeps (Thave) */
#define PROTO_SECRET_SIZE 32		/* a peer grant's secret */
#define PROTO_MAX_GRANTS 64		/* grants a session holds at once */
#define PROTO_MAX_GRANT_TTL 600		/* seconds a grant may live */
#define PROTO_MAX_PEER_HOST 255		/* Tpeersend hostlen */
#define PROTO_RREAD_INLINE 4096		/* larger Rread data: kept by reference */
#define PROTO_RESUME_REFS 8		/* Rreads kept by reference (CAP_ACK) */
#define PROTO_LINK_MAGIC 0x4b4e4c4d	/* the bytes "MLNK": a link message */
#define PROTO_LINK_HDR_SIZE 32		/* a link message's header */

/* Message types: a T-message is a request, its R-message the reply (T+1). */
enum proto_type {
	PROTO_RERROR = 1,
	PROTO_THELLO = 2,	PROTO_RHELLO = 3,
	PROTO_TAUTH = 4,	PROTO_RAUTH = 5,
	PROTO_TPING = 6,	PROTO_RPING = 7,
	PROTO_TSYNC = 8,	PROTO_RSYNC = 9,
	PROTO_TALLOC = 10,				/* no reply */
	PROTO_TFREE = 12,				/* no reply */
	PROTO_TWRITE = 14,				/* no reply */
	PROTO_TREAD = 16,	PROTO_RREAD = 17,
	PROTO_TCOPY = 18,				/* no reply */
	PROTO_TLOAD = 20,				/* no reply */
	PROTO_TUNLOAD = 22,				/* no reply */
	PROTO_TLAUNCH = 24,	PROTO_RLAUNCH = 25,	/* reply only with FWAIT */
	PROTO_TGRAPH = 26,				/* no reply */
	PROTO_TGRAPHRUN = 28,	PROTO_RGRAPHRUN = 29,	/* reply only with FWAIT */
	PROTO_TGRAPHFREE = 30,				/* no reply */
	PROTO_TCLOCK = 32,	PROTO_RCLOCK = 33,
	PROTO_TPROFILE = 34,	PROTO_RPROFILE = 35,
	PROTO_THAVE = 36,	PROTO_RHAVE = 37,	/* CAP_CACHE */
	PROTO_TWRITEHASH = 38,				/* CAP_CACHE, no reply */
	PROTO_TRESUMEKEY = 46,	PROTO_RRESUMEKEY = 47,	/* CAP_RESUME */
	PROTO_TRESUME = 48,	PROTO_RRESUME = 49,	/* CAP_RESUME */
	PROTO_TACK = 50,				/* CAP_ACK, no reply */
	/* Copies between runners (protocol.md, Copies between runners):
	 * Tpeer and Rpeer travel only on a peer connection, never a session. */
	PROTO_TGRANT = 40,	PROTO_RGRANT = 41,
	PROTO_TPEERSEND = 42,	PROTO_RPEERSEND = 43,
	PROTO_TPEER = 44,	PROTO_RPEER = 45,
	/* Links between runners (protocol.md, Links between runners). */
	PROTO_TLISTEN = 52,	PROTO_RLISTEN = 53,	/* CAP_LINK */
	PROTO_TDIAL = 54,	PROTO_RDIAL = 55,	/* CAP_LINK */
	PROTO_TUNLINK = 56				/* CAP_LINK, no reply */
};

/* hdr.flags */
enum proto_flag {
	PROTO_FWAIT = 1,	/* Tlaunch, Tgraphrun: wait, reply with the device time */
	PROTO_FCACHE = 2	/* Twrite (CAP_CACHE): also keep the data in the cache */
};

/* Rerror.code */
enum proto_error {
	PROTO_EPROTO = 1,	/* malformed frame; the connection is closed */
	PROTO_EVERSION = 2,	/* unsupported version or magic; connection closed */
	PROTO_EAUTH = 3,	/* authentication failed; connection closed */
	PROTO_ESTATE = 4,	/* request not allowed before hello/auth; closed */
	PROTO_EHANDLE = 5,	/* no such buffer, program or graph handle */
	PROTO_EEXIST = 6,	/* handle already in use */
	PROTO_ERANGE = 7,	/* offset/count outside the object, or wraps */
	PROTO_EINVAL = 8,	/* a field has an invalid value */
	PROTO_ENOMEM = 9,	/* the device or host is out of memory */
	PROTO_ELIMIT = 10,	/* over a limit the runner was started with */
	PROTO_EKIND = 11,	/* backend does not accept this program kind */
	PROTO_EPROGRAM = 12,	/* program rejected: wrong arch, corrupt, compile error */
	PROTO_EDEVICE = 13,	/* the device failed to run a kernel or copy */
	PROTO_EMORE = 14,	/* more errors occurred than were kept */
	PROTO_ECRASH = 15,	/* a kernel crashed; the session ends */
	PROTO_ETIMEOUT = 16,	/* a kernel or the client exceeded a time limit */
	PROTO_ENOTCACHED = 17,	/* Twritehash: the session holds no such content */
	PROTO_ECACHE = 18,	/* cached content failed verification: dropped */
	PROTO_ERESUME = 21,	/* the session cannot be resumed; connection closed */
	PROTO_EGRANT = 19,	/* a peer grant is unknown, used, expired or forged */
	PROTO_EPEER = 20	/* the destination runner cannot be reached */
};

/* Rhello.backend */
enum proto_backend {
	PROTO_BACKEND_CPU = 1,
	PROTO_BACKEND_METAL = 2
};

/* Rhello.caps */
enum proto_cap {
	PROTO_CAP_AUTH = 1,		/* Tauth must follow Rhello */
	PROTO_CAP_UNIFIED = 2,		/* device memory is host memory */
	PROTO_CAP_CPU_IMAGE = 4,	/* accepts PROTO_PROG_CPU_IMAGE */
	PROTO_CAP_METALLIB = 8,		/* accepts PROTO_PROG_METALLIB */
	PROTO_CAP_METAL_SOURCE = 16,	/* accepts PROTO_PROG_METAL_SOURCE */
	PROTO_CAP_PROFILE = 32,		/* accepts Tclock and Tprofile */
	PROTO_CAP_CACHE = 64,		/* a content cache: Thave, Twritehash, FCACHE */
	PROTO_CAP_RESUME = 256,		/* sessions survive a dropped link */
	PROTO_CAP_ACK = 512,		/* accepts Tack (with CAP_RESUME) */
	PROTO_CAP_PEER = 128,		/* accepts Tgrant, Tpeersend and peers */
	PROTO_CAP_LINK = 1024		/* links: Tlisten, Tdial, Tunlink, link programs */
};

/* Tload.kind */
enum proto_prog_kind {
	PROTO_PROG_CPU_IMAGE = 1,	/* relocated position-independent machine code */
	PROTO_PROG_METALLIB = 2,	/* a compiled Metal library (MTLB) */
	PROTO_PROG_METAL_SOURCE = 3,	/* Metal Shading Language source text */
	PROTO_PROG_LINK_SEND = 4,	/* CAP_LINK: send a buffer range on a link */
	PROTO_PROG_LINK_RECV = 5	/* CAP_LINK: receive a link message into one */
};

/* Tload.arch (CPU images; 0 for Metal programs) */
enum proto_arch {
	PROTO_ARCH_NONE = 0,
	PROTO_ARCH_X86_64 = 1,
	PROTO_ARCH_ARM64 = 2,
	PROTO_ARCH_RISCV64 = 3
};

/* Tgraphrun patch kinds */
enum proto_patch_kind {
	PROTO_PATCH_BUF = 1,	/* buffer argument index := handle, offset(value) */
	PROTO_PATCH_VAL = 2,	/* integer argument index := value */
	PROTO_PATCH_GLOBAL = 3,	/* global size dimension index (0..2) := value */
	PROTO_PATCH_LOCAL = 4	/* local size dimension index (0..2) := value */
};

/* Tprofile.mode */
enum proto_profile_mode {
	PROTO_PROFILE_OFF = 0,	/* stop recording; records not returned are dropped */
	PROTO_PROFILE_ON = 1	/* record every kernel and copy from now on */
};

/* Tresumekey.mode */
enum proto_resumekey_mode {
	PROTO_RESUME_OFF = 0,	/* the session ends with its connection */
	PROTO_RESUME_ON = 1	/* issue the key: the session may be resumed */
};

/* Profile record kinds */
enum proto_prof_kind {
	PROTO_PROF_LAUNCH = 1,	/* a Tlaunch's kernel */
	PROTO_PROF_GRAPH = 2,	/* one entry of a Tgraphrun */
	PROTO_PROF_WRITE = 3,	/* a Twrite's data into its buffer */
	PROTO_PROF_READ = 4,	/* an Rread's data out of its buffer */
	PROTO_PROF_COPY = 5	/* a Tcopy on the device */
};

/* size[4] type[2] flags[2] tag[4] */
struct proto_hdr {
	uint32_t size;
	uint16_t type;
	uint16_t flags;
	uint32_t tag;
};

/* size[4] Rerror tag[4] code[4] count[4] text[count] */
struct proto_rerror {
	struct proto_hdr h;
	uint32_t code;
	uint32_t count;
};

/* size[4] Thello tag[4] magic[4] version[4] maxmsg[4] */
struct proto_thello {
	struct proto_hdr h;
	uint32_t magic;
	uint32_t version;
	uint32_t maxmsg;
};

/* size[4] Rhello tag[4] magic[4] version[4] maxmsg[4] backend[2] caps[2]
 *   ncores[4] memory[8] maxbuf[8] maxhandles[4] session[4] nonce[32]
 *   name[64] arch[16] cpu[32] features[128]   (strings NUL-padded) */
struct proto_rhello {
	struct proto_hdr h;
	uint32_t magic;
	uint32_t version;
	uint32_t maxmsg;
	uint16_t backend;
	uint16_t caps;
	uint32_t ncores;
	uint64_t memory;
	uint64_t maxbuf;
	uint32_t maxhandles;
	uint32_t session;
	uint8_t nonce[32];
	char name[64];
	char arch[16];
	char cpu[32];		/* CPU: -mcpu; Metal: macOS "14.5.0" */
	char features[128];	/* CPU: "+a,-b"; Metal: newest MSL "3.1" */
};

/* size[4] Tauth tag[4] cnonce[32] mac[32] */
struct proto_tauth {
	struct proto_hdr h;
	uint8_t cnonce[32];
	uint8_t mac[32];
};

/* size[4] Rauth tag[4] mac[32] */
struct proto_rauth {
	struct proto_hdr h;
	uint8_t mac[32];
};

/* size[4] Tping tag[4] count[4] data[count]; Rping echoes it */
struct proto_ping {
	struct proto_hdr h;
	uint32_t count;
};

/* size[4] Tsync tag[4]; size[4] Rsync tag[4] */
struct proto_sync {
	struct proto_hdr h;
};

/* size[4] Talloc tag[4] handle[4] size[8] */
struct proto_talloc {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t size;
};

/* size[4] Tfree tag[4] handle[4] */
struct proto_tfree {
	struct proto_hdr h;
	uint32_t handle;
};

/* size[4] Twrite tag[4] handle[4] offset[8] count[8] data[count] */
struct proto_twrite {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t offset;
	uint64_t count;
};

/* size[4] Tread tag[4] handle[4] offset[8] count[8] */
struct proto_tread {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t offset;
	uint64_t count;
};

/* size[4] Rread tag[4] count[4] data[count] */
struct proto_rread {
	struct proto_hdr h;
	uint32_t count;
};

/* size[4] Tcopy tag[4] dst[4] src[4] pad[4] dstoff[8] srcoff[8] count[8] */
struct proto_tcopy {
	struct proto_hdr h;
	uint32_t dst;
	uint32_t src;
	uint32_t pad;
	uint64_t dstoff;
	uint64_t srcoff;
	uint64_t count;
};

/* size[4] Tload tag[4] prog[4] kind[2] arch[2] nbufs[2] nvals[2] corearg[2]
 *   pad[2] entry[4] crc[4] namelen[4] datalen[4] name[namelen] data[datalen] */
struct proto_tload {
	struct proto_hdr h;
	uint32_t prog;
	uint16_t kind;
	uint16_t arch;
	uint16_t nbufs;
	uint16_t nvals;
	uint16_t corearg;
	uint16_t pad;
	uint32_t entry;
	uint32_t crc;
	uint32_t namelen;
	uint32_t datalen;
};

/* size[4] Tunload tag[4] prog[4] */
struct proto_tunload {
	struct proto_hdr h;
	uint32_t prog;
};

/* One kernel launch: prog[4] nbufs[2] nvals[2] global[3*4] local[3*4],
 * followed by nbufs proto_arg and nvals value[8]. */
struct proto_launch {
	uint32_t prog;
	uint16_t nbufs;
	uint16_t nvals;
	uint32_t global[3];
	uint32_t local[3];
};

/* A buffer argument: handle[4] pad[4] offset[8] */
struct proto_arg {
	uint32_t handle;
	uint32_t pad;
	uint64_t offset;
};

/* size[4] Tlaunch tag[4] pad[4] launch[32] arg[16*nbufs] value[8*nvals] */
struct proto_tlaunch {
	struct proto_hdr h;
	uint32_t pad;
	struct proto_launch l;
};

/* size[4] Rlaunch tag[4] pad[4] ns[8]; Rgraphrun has the same layout */
struct proto_rtime {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t ns;
};

/* size[4] Tgraph tag[4] graph[4] count[4] pad[4] launch-record[count]
 * where each record is a proto_launch with its args and values. */
struct proto_tgraph {
	struct proto_hdr h;
	uint32_t graph;
	uint32_t count;
	uint32_t pad;
};

/* entry[4] kind[2] index[2] handle[4] pad[4] value[8] */
struct proto_patch {
	uint32_t entry;
	uint16_t kind;
	uint16_t index;
	uint32_t handle;
	uint32_t pad;
	uint64_t value;
};

/* size[4] Tgraphrun tag[4] graph[4] count[4] pad[4] patch[24*count] */
struct proto_tgraphrun {
	struct proto_hdr h;
	uint32_t graph;
	uint32_t count;
	uint32_t pad;
};

/* size[4] Tgraphfree tag[4] graph[4] */
struct proto_tgraphfree {
	struct proto_hdr h;
	uint32_t graph;
};

/* size[4] Tclock tag[4]: a proto_sync. size[4] Rclock tag[4] pad[4] clock[8] */
struct proto_rclock {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t clock;
};

/* size[4] Tprofile tag[4] mode[4] count[4] */
struct proto_tprofile {
	struct proto_hdr h;
	uint32_t mode;
	uint32_t count;
};

/* size[4] Rprofile tag[4] count[4] left[4] lost[4] cap[4] pad[4]
 *   record[40*count] */
struct proto_rprofile {
	struct proto_hdr h;
	uint32_t count;
	uint32_t left;
	uint32_t lost;
	uint32_t cap;
	uint32_t pad;
};

/* size[4] Thave tag[4] count[4] hash[32*count];
 * size[4] Rhave tag[4] count[4] held[count] */
struct proto_have {
	struct proto_hdr h;
	uint32_t count;
};

/* size[4] Twritehash tag[4] handle[4] offset[8] count[8] hash[32] */
struct proto_twritehash {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t offset;
	uint64_t count;
	uint8_t hash[32];
};

/* size[4] Tresumekey tag[4] mode[4] */
struct proto_tresumekey {
	struct proto_hdr h;
	uint32_t mode;
};

/* size[4] Rresumekey tag[4] grace[4] log[8] secret[32] */
struct proto_rresumekey {
	struct proto_hdr h;
	uint32_t grace;
	uint64_t log;
	uint8_t secret[32];
};

/* size[4] Tresume tag[4] session[4] sent[8] received[8] cnonce[32] mac[32] */
struct proto_tresume {
	struct proto_hdr h;
	uint32_t session;
	uint64_t sent;
	uint64_t received;
	uint8_t cnonce[32];
	uint8_t mac[32];
};

/* size[4] Rresume tag[4] pad[4] processed[8] mac[32] */
struct proto_rresume {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t processed;
	uint8_t mac[32];
};

/* size[4] Tack tag[4] pad[4] received[8] */
struct proto_tack {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t received;
};

/* One profile record: kind[2] entry[2] tag[4] handle[4] aux[4] start[8]
 *   end[8] count[8]; start and end in the runner's clock (Rclock), ns. */
struct proto_prof {
	uint16_t kind;
	uint16_t entry;
	uint32_t tag;
	uint32_t handle;
	uint32_t aux;
	uint64_t start;
	uint64_t end;
	uint64_t count;
};

/* size[4] Tgrant tag[4] handle[4] offset[8] count[8] ttl[4] pad[4] */
struct proto_tgrant {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t offset;
	uint64_t count;
	uint32_t ttl;
	uint32_t pad;
};

/* size[4] Rgrant tag[4] pad[4] grant[8] secret[32] */
struct proto_rgrant {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t grant;
	uint8_t secret[32];
};

/* size[4] Tpeersend tag[4] handle[4] offset[8] count[8] grant[8]
 *   secret[32] port[2] hostlen[2] pad[4] host[hostlen] */
struct proto_tpeersend {
	struct proto_hdr h;
	uint32_t handle;
	uint64_t offset;
	uint64_t count;
	uint64_t grant;
	uint8_t secret[32];
	uint16_t port;
	uint16_t hostlen;
	uint32_t pad;
};

/* Rpeersend: size[4] Rpeersend tag[4] pad[4] ns[8], a proto_rtime. */

/* size[4] Tpeer tag[4] magic[4] grant[8] count[8] cnonce[32] mac[32]: the
 *   first frame of a peer connection */
struct proto_tpeer {
	struct proto_hdr h;
	uint32_t magic;
	uint64_t grant;
	uint64_t count;
	uint8_t cnonce[32];
	uint8_t mac[32];
};

/* size[4] Rpeer tag[4] pad[4] count[8] mac[32] */
struct proto_rpeer {
	struct proto_hdr h;
	uint32_t pad;
	uint64_t count;
	uint8_t mac[32];
};

/* size[4] Tlisten tag[4] link[4] ttl[4]; Rlisten is a proto_rgrant */
struct proto_tlisten {
	struct proto_hdr h;
	uint32_t link;
	uint32_t ttl;
};

/* size[4] Tdial tag[4] link[4] port[2] hostlen[2] pad[4] grant[8]
 *   secret[32] host[hostlen]; Rdial is a proto_rtime */
struct proto_tdial {
	struct proto_hdr h;
	uint32_t link;
	uint16_t port;
	uint16_t hostlen;
	uint32_t pad;
	uint64_t grant;
	uint8_t secret[32];
};

/* size[4] Tunlink tag[4] link[4] */
struct proto_tunlink {
	struct proto_hdr h;
	uint32_t link;
};

/* A message on a link (not a frame): magic[4] pad[4] seq[8] channel[8]
 *   count[8] data[count] */
struct proto_linkhdr {
	uint32_t magic;
	uint32_t pad;
	uint64_t seq;
	uint64_t channel;
	uint64_t count;
};

#endif
