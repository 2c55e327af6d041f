/* Unit tests of the embedded web view (daemon/ui.c, daemon/embed_ui.cmake):
 * every file of daemon/ui is in the table byte for byte, content types by
 * extension, every same-origin reference in index.html (src=, href=) names an
 * embedded file, and no embedded file loads anything from another origin
 * (no CDN: the CSP would block it anyway, this catches it at build time).
 * Usage: test_ui SOURCE_UI_DIR */
#include "daemon/ui.h"
#include "tests/check.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* Each file on disk is embedded with the same bytes; counts match. */
static void test_table_matches_dir(const char *dir) {
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    if (!d) return;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *disk = read_file(path, &len);
        if (!disk) continue; /* a folder */
        n++;
        const struct ui_file *f = ui_find(e->d_name);
        CHECK(f != NULL, "%s is not embedded", e->d_name);
        if (f) {
            CHECK(f->len == len && memcmp(f->data, disk, len) == 0, "%s differs (%zu vs %zu bytes)",
                  e->d_name, f->len, len);
            CHECK(f->data[f->len] == 0, "%s not NUL-terminated", e->d_name);
        }
        free(disk);
    }
    closedir(d);
    CHECK(n == ui_files_count, "%d files on disk, %d embedded", n, ui_files_count);
    CHECK(ui_find("index.html") && ui_find("app.js") && ui_find("style.css"), "core files");
    CHECK(ui_find("nope.js") == NULL && ui_find("") == NULL && ui_find(NULL) == NULL, "absent");
    CHECK(ui_find("../ui.c") == NULL, "no path escapes");
}

static void test_content_types(void) {
    static const struct {
        const char *name, *want;
    } cases[] = {
        {"index.html", "text/html; charset=utf-8"},
        {"app.js", "text/javascript; charset=utf-8"},
        {"style.css", "text/css; charset=utf-8"},
        {"favicon.svg", "image/svg+xml"},
        {"x.png", "image/png"},
        {"js", "application/octet-stream"},
        {"archive.tar", "application/octet-stream"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK(strcmp(ui_content_type(cases[i].name), cases[i].want) == 0, "%s -> %s", cases[i].name,
              ui_content_type(cases[i].name));
}

/* src="ui/X" and href="ui/X" in index.html name embedded files. */
static void test_index_references(void) {
    const struct ui_file *idx = ui_find("index.html");
    if (!idx) return;
    const char *p = (const char *)idx->data;
    int refs = 0;
    while ((p = strstr(p, "=\"ui/"))) {
        p += 5;
        const char *q = strchr(p, '"');
        if (!q) break;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(q - p), p);
        CHECK(ui_find(name) != NULL, "index.html references ui/%s, which is not embedded", name);
        refs++;
    }
    CHECK(refs >= 3, "index.html references %d embedded files (script, style, icon)", refs);
}

/* Nothing is loaded from another origin. */
static void test_no_external(void) {
    static const char *const bad[] = {"http://", "https://", "//cdn", "src=\"//", "href=\"//"};
    for (int i = 0; i < ui_files_count; i++) {
        const char *s = (const char *)ui_files[i].data;
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            const char *hit = strstr(s, bad[b]);
            /* The SVG namespace URI is an identifier, not a fetch. */
            if (hit && strncmp(hit, "http://www.w3.org/2000/svg", 26) == 0)
                hit = strstr(hit + 26, bad[b]);
            CHECK(hit == NULL, "%s contains '%s'", ui_files[i].name, bad[b]);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_ui SOURCE_UI_DIR\n");
        return 2;
    }
    test_table_matches_dir(argv[1]);
    test_content_types();
    test_index_references();
    test_no_external();
    if (check_failures)
        fprintf(stderr, "test_ui: %d failure(s)\n", check_failures);
    else
        printf("test_ui: ok (%d embedded files)\n", ui_files_count);
    return check_failures ? 1 : 0;
}
