/*
 * keyshift/keyshift.h -- umbrella header for libkeyshift.
 */
#ifndef KEYSHIFT_KEYSHIFT_H
#define KEYSHIFT_KEYSHIFT_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/envelope.h>
#include <keyshift/aad.h>
#include <keyshift/provider.h>
#include <keyshift/crypto.h>
#include <keyshift/keyring.h>
#include <keyshift/pkcs11.h>
#include <keyshift/registry.h>
#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>
#include <keyshift/migrate.h>
#include <keyshift/health.h>
#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>
#include <keyshift/app.h>

#endif /* KEYSHIFT_KEYSHIFT_H */
