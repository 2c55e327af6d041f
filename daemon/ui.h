/* loomd's web view: GET /ui (the page) and GET /ui/{file} (its script, style
 * sheet...). The files live in daemon/ui/ and are embedded into the binary at
 * build time (daemon/embed_ui.cmake generates ui_files[]), so nothing is read
 * from disk and the page loads nothing from outside loomd.
 *
 * Both routes are open (HTTP_AUTH_ANYONE): the static files hold no data. The
 * page asks for a token once, keeps it in the browser's sessionStorage and
 * calls the public REST API with it; the API enforces access as for any
 * client. Replies carry a strict Content-Security-Policy (same origin only). */
#ifndef LOOM_DAEMON_UI_H
#define LOOM_DAEMON_UI_H

#include <stddef.h>

struct http_req;

/* One embedded file (generated table, sorted by name). */
struct ui_file {
    const char *name;          /* "app.js" */
    const unsigned char *data; /* NUL-terminated copy of the bytes */
    size_t len;                /* length without the NUL */
};
extern const struct ui_file ui_files[];
extern const int ui_files_count;

/* The embedded file called `name`, or NULL. Any thread. */
const struct ui_file *ui_find(const char *name);
/* Content-Type for a file name by its extension ("text/html; charset=utf-8"...). */
const char *ui_content_type(const char *name);

/* Route handlers: GET /ui serves index.html; GET /ui/{file} an embedded file
 * (404 UI_FILE_NOT_FOUND otherwise). */
int ui_index(struct http_req *req);
int ui_get(struct http_req *req);

#endif
