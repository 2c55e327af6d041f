/* Serves the embedded web view (see daemon/ui.h). The file table is small
 * (a handful of entries), so lookup is a linear scan. Every reply is a copy
 * of static bytes; no state, any thread. */
#include "daemon/ui.h"

#include <string.h>

#include "daemon/http.h"

static const struct {
    const char *ext;
    const char *type;
} content_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".json", "application/json"},
    {".txt", "text/plain; charset=utf-8"},
};

/* Same origin only: no inline script, no external hosts. Inline styles are
 * not used either; canvas drawing needs nothing extra. */
static const char csp[] = "default-src 'self'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                          "base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

const struct ui_file *ui_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < ui_files_count; i++)
        if (strcmp(ui_files[i].name, name) == 0) return &ui_files[i];
    return NULL;
}

const char *ui_content_type(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof content_types / sizeof *content_types; i++) {
        size_t e = strlen(content_types[i].ext);
        if (n > e && strcmp(name + n - e, content_types[i].ext) == 0) return content_types[i].type;
    }
    return "application/octet-stream";
}

static int serve(struct http_req *req, const char *name) {
    const struct ui_file *f = ui_find(name);
    if (!f) return http_error(req, 404, "UI_FILE_NOT_FOUND", "no file '%s' in the web view", name);
    http_add_header(req, "Content-Security-Policy", csp);
    http_add_header(req, "X-Content-Type-Options", "nosniff");
    http_add_header(req, "Referrer-Policy", "no-referrer");
    /* The files change only with the binary; revalidating costs little. */
    http_add_header(req, "Cache-Control", "no-cache");
    return http_reply_text(req, 200, ui_content_type(name), (const char *)f->data, f->len);
}

int ui_index(struct http_req *req) {
    return serve(req, "index.html");
}

int ui_get(struct http_req *req) {
    return serve(req, http_param(req, "file"));
}
