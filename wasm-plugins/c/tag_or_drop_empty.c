/* A linkbus filter in C, to show that the filter ABI v1 (docs/filter-abi.md) belongs to no
 * one language: it drops messages with an empty payload and tags the others with the
 * header `x-filter: c`. No libc; one bump allocator, reset at each batch.
 *
 * Build (clang 14 with lld): see ../build.sh. */

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

extern void linkbus_log(int level, const u8 *ptr, int len) __attribute__((import_module("linkbus"), import_name("log")));
extern void linkbus_counter_add(const u8 *name, int len, long long delta)
    __attribute__((import_module("linkbus"), import_name("counter_add")));

#define HEAP_BYTES (8 << 20)
static u8 heap[HEAP_BYTES];
static u32 used;

static u8 *bump(u32 len) {
    if (len > HEAP_BYTES - used) return 0;
    u8 *at = heap + used;
    used += (len + 7) & ~7u;
    return at;
}

__attribute__((export_name("linkbus_abi_v1"))) int abi_v1(void) { return 1; }

/* The host writes the batch here: the heap starts over for each batch. */
__attribute__((export_name("linkbus_alloc"))) u8 *alloc(int len) {
    used = 0;
    return len < 0 ? 0 : bump((u32)len);
}

struct reader { const u8 *at, *end; int ok; };

static u32 get_u32(struct reader *r) {
    if (r->end - r->at < 4) { r->ok = 0; return 0; }
    u32 n = (u32)r->at[0] | (u32)r->at[1] << 8 | (u32)r->at[2] << 16 | (u32)r->at[3] << 24;
    r->at += 4;
    return n;
}

/* Skips a length-prefixed string; returns its length. */
static u32 skip_bytes(struct reader *r) {
    u32 n = get_u32(r);
    if ((u32)(r->end - r->at) < n) { r->ok = 0; return 0; }
    r->at += n;
    return n;
}

static u8 *out;
static u32 out_len;

static void put_u8(u8 b) { out[out_len++] = b; }
static void put_u32(u32 n) { for (int i = 0; i < 4; i++) put_u8((u8)(n >> (8 * i))); }
static void put_str(const char *s) {
    u32 n = 0;
    while (s[n]) n++;
    put_u32(n);
    for (u32 i = 0; i < n; i++) put_u8((u8)s[i]);
}

__attribute__((export_name("linkbus_filter"))) long long filter(int hook, const u8 *batch, int len) {
    (void)hook;
    struct reader r = { batch, batch + len, 1 };
    u32 count = get_u32(&r);
    /* Each verdict takes at most 64 bytes here. */
    out = bump(4 + count * 64);
    out_len = 0;
    if (!out || !r.ok) return -2;
    put_u32(count);
    for (u32 i = 0; i < count && r.ok; i++) {
        u32 flags = get_u32(&r);
        skip_bytes(&r);                    /* source */
        get_u32(&r); get_u32(&r);          /* sequence */
        get_u32(&r); get_u32(&r);          /* priority, hop count */
        skip_bytes(&r);                    /* name */
        for (u32 n = get_u32(&r); n > 0 && r.ok; n--) skip_bytes(&r);
        for (u32 n = get_u32(&r); n > 0 && r.ok; n--) { skip_bytes(&r); skip_bytes(&r); }
        u32 payload = skip_bytes(&r);
        if (payload == 0 && !(flags & 1)) {
            put_u8(1);                     /* drop */
            put_str("empty payload");
            linkbus_counter_add((const u8 *)"empty", 5, 1);
        } else if (flags & 1) {
            put_u8(0);                     /* pass: a sealed message may not be changed */
        } else {
            put_u8(2);                     /* change: no new payload, one header set */
            put_u8(0);
            put_u32(1);
            put_u8(0);
            put_str("x-filter");
            put_str("c");
        }
    }
    if (!r.ok) {
        linkbus_log(2, (const u8 *)"malformed batch", 15);
        return -2;
    }
    return (long long)(u64)(unsigned long)out << 32 | out_len;
}
