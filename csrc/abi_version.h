/* Generated from ABI_VERSION in gpudash/engine/_native.py by `python -m gpudash.engine.knob_header`; do not
 * edit. Raise ABI_VERSION there (and regenerate) whenever gpudash_engine.h changes a function or struct. */
#ifndef GPUDASH_ABI_VERSION_H
#define GPUDASH_ABI_VERSION_H

#define GE_ABI_VERSION 2

#endif
