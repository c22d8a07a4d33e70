/*
 * migrate/iface.c -- the store interfaces' own functions (keyshift/rowstore.h,
 * keyshift/chunks.h): closing any store through its operations.  They
 * belong to no database, so the engine (which may not call into
 * migrate/store/) and every store share them.
 */
#include <string.h>

#include <keyshift/chunks.h>
#include <keyshift/rowstore.h>

/* See rowstore.h. */
void ks_rowstore_close(ks_rowstore *store)
{
    if (store == NULL)
        return;
    if (store->ops != NULL && store->ops->close != NULL && store->self != NULL)
        store->ops->close(store->self);
    memset(store, 0, sizeof *store);
}

/* See chunks.h. */
void ks_chunks_close(ks_chunks *chunks)
{
    if (chunks == NULL || chunks->ops == NULL)
        return;
    chunks->ops->close(chunks->self);
    memset(chunks, 0, sizeof *chunks);
}
