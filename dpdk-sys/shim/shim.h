/* The fast path of DPDK is made of static inline functions, which a binding cannot call.
 * These wrappers cross the language boundary once per burst, never once per packet. */
#ifndef INA_DPDK_SHIM_H
#define INA_DPDK_SHIM_H

#include <stdint.h>
#include <rte_config.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>

/* rte_errno of the calling thread. */
int ina_errno(void);

/* Receives up to n frames on (port, queue): each frame's mbuf, data pointer and length.
 * The frames stay valid until ina_free_bulk(mbufs, count). Returns the count. */
uint16_t ina_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs,
                      const uint8_t **data, uint16_t *len, uint16_t n);

/* Frees n mbufs. */
void ina_free_bulk(struct rte_mbuf **mbufs, unsigned int n);

/* Allocates n mbufs from pool, each one's data pointer and the bytes it can hold. Returns 0, or
 * -1 if the pool has fewer than n free. */
int ina_alloc_bulk(struct rte_mempool *pool, struct rte_mbuf **mbufs, uint8_t **data,
                   uint16_t *room, unsigned int n);

/* Sets mbuf i's frame length to len[i] (written in place by the caller) and transmits the
 * burst on (port, queue); returns how many the queue took (a prefix). The rest stay the
 * caller's, to send again or free. */
uint16_t ina_tx_filled(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs,
                       const uint16_t *len, uint16_t n);

/* The data room of an mbuf of this pool: the largest frame it holds. */
uint16_t ina_pool_data_room(struct rte_mempool *pool);

/* The version string of the DPDK this was built against. */
const char *ina_version(void);

#endif
