/* Huge-page memory for streamed data (hugemem.c). Zero-filled, like calloc. */
#ifndef PD_HUGEMEM_H
#define PD_HUGEMEM_H
#include <stddef.h>

void *pd_huge_alloc(size_t bytes);           /* NULL when the memory is not there */
void pd_huge_free(void *p, size_t bytes);    /* bytes: as given to pd_huge_alloc */

#endif
