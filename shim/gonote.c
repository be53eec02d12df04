// The start-up check for a second Go runtime: two Go runtimes in one process
// fight over signals and threads, so the shim stays passive when any other
// loaded object was linked by Go. Go's linker marks each such object with an
// ELF note named "Go" of type 4 (its build id).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include "internal.h"

#define GO_NOTE_NAME "Go"
#define GO_NOTE_BUILDID 4

#define ALIGN4(n) (((n) + 3u) & ~3u)

// note_is_go walks one PT_NOTE segment: each note is a header, then its name
// and its descriptor, each padded to 4 bytes.
static int note_is_go(const char *p, size_t n) {
	size_t off = 0;
	while (off + sizeof(ElfW(Nhdr)) <= n) {
		ElfW(Nhdr) h;
		memcpy(&h, p + off, sizeof h);
		const char *name = p + off + sizeof h;
		if (h.n_type == GO_NOTE_BUILDID && h.n_namesz >= sizeof GO_NOTE_NAME &&
		    off + sizeof h + sizeof GO_NOTE_NAME <= n && !memcmp(name, GO_NOTE_NAME, sizeof GO_NOTE_NAME))
			return 1;
		off += sizeof h + ALIGN4(h.n_namesz) + ALIGN4(h.n_descsz);
	}
	return 0;
}

static uintptr_t g_self_base;

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	if (info->dlpi_addr == g_self_base) return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_NOTE &&
		    note_is_go((const char *)(info->dlpi_addr + ph->p_vaddr), ph->p_memsz)) {
			*(int *)data = 1;
			return 1;
		}
	}
	return 0;
}

int mpi5k_other_go_runtime(void) {
	Dl_info di;
	if (dladdr((void *)&mpi5k_other_go_runtime, &di) && di.dli_fbase) {
		// dlpi_addr is the load bias; for a shared object it equals the base.
		g_self_base = (uintptr_t)di.dli_fbase;
	}
	int found = 0;
	dl_iterate_phdr(phdr_cb, &found);
	return found;
}
