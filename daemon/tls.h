/* TLS material for loomd's HTTPS listener (--tls-cert/--tls-key). The files
 * are read and checked here (PEM parse, key matches certificate) so that a
 * bad pair fails start-up with a message naming the file, instead of
 * libmicrohttpd's generic "failed to start". Serving is libmicrohttpd's
 * GnuTLS support (daemon/http.c). */
#ifndef LOOM_DAEMON_TLS_H
#define LOOM_DAEMON_TLS_H

/* TLS 1.2 and 1.3 only (GnuTLS priority string). */
#define TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

/* Reads cert_path and key_path (PEM) into *cert_pem and *key_pem (caller
 * frees) after checking that both parse and that the key belongs to the
 * certificate. 0, or -1 after logging why. */
int tls_load(const char *cert_path, const char *key_path, char **cert_pem, char **key_pem);

/* 1 when libmicrohttpd was built with TLS support. */
int tls_supported(void);

#endif
