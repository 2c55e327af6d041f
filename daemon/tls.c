/* TLS material checks for loomd (see tls.h). OpenSSL's libcrypto parses the
 * PEM files and compares the key with the certificate; libmicrohttpd gets the
 * PEM text unchanged. */
#include "daemon/tls.h"

#include <errno.h>
#include <microhttpd.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/log.h"

#define TLS_MAX_FILE (1 << 20)

int tls_supported(void) {
    return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES;
}

static char *read_pem(const char *what, const char *path) {
    size_t n = 0;
    char *text = fs_read_file(path, TLS_MAX_FILE, &n);
    if (!text) log_error("tls: cannot read %s %s: %s", what, path, strerror(errno));
    return text;
}

int tls_load(const char *cert_path, const char *key_path, char **cert_pem, char **key_pem) {
    int rc = -1;
    char *cert = NULL, *key = NULL;
    BIO *cb = NULL, *kb = NULL;
    X509 *x = NULL;
    EVP_PKEY *pk = NULL;
    *cert_pem = *key_pem = NULL;
    if (!tls_supported()) {
        log_error("tls: this libmicrohttpd was built without TLS support; use a reverse proxy");
        goto out;
    }
    if (!(cert = read_pem("--tls-cert", cert_path)) || !(key = read_pem("--tls-key", key_path)))
        goto out;
    cb = BIO_new_mem_buf(cert, -1);
    kb = BIO_new_mem_buf(key, -1);
    if (!cb || !kb) goto out;
    x = PEM_read_bio_X509(cb, NULL, NULL, NULL);
    if (!x) {
        log_error("tls: --tls-cert %s holds no PEM certificate", cert_path);
        goto out;
    }
    pk = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL);
    if (!pk) {
        log_error("tls: --tls-key %s holds no unencrypted PEM private key", key_path);
        goto out;
    }
    if (X509_check_private_key(x, pk) != 1) {
        log_error("tls: --tls-key %s does not match the certificate in --tls-cert %s", key_path,
                  cert_path);
        goto out;
    }
    *cert_pem = cert;
    *key_pem = key;
    cert = key = NULL;
    rc = 0;
out:
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(pk);
    BIO_free(cb);
    BIO_free(kb);
    free(cert);
    if (key) OPENSSL_cleanse(key, strlen(key));
    free(key);
    return rc;
}
