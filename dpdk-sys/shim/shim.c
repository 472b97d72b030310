#include "shim.h"

int ina_errno(void) { return rte_errno; }

uint16_t ina_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs,
                      const uint8_t **data, uint16_t *len, uint16_t n) {
    uint16_t got = rte_eth_rx_burst(port, queue, mbufs, n);
    for (uint16_t i = 0; i < got; i++) {
        struct rte_mbuf *m = mbufs[i];
        data[i] = rte_pktmbuf_mtod(m, const uint8_t *);
        /* A frame in several segments is seen by its first segment only; the caller asks
         * for single-segment frames (no scatter) and counts the cut ones by pkt_len. */
        len[i] = m->nb_segs == 1 ? m->data_len : 0;
    }
    return got;
}

void ina_free_bulk(struct rte_mbuf **mbufs, unsigned int n) { rte_pktmbuf_free_bulk(mbufs, n); }

int ina_alloc_bulk(struct rte_mempool *pool, struct rte_mbuf **mbufs, uint8_t **data,
                   uint16_t *room, unsigned int n) {
    if (rte_pktmbuf_alloc_bulk(pool, mbufs, n) != 0) return -1;
    for (unsigned int i = 0; i < n; i++) {
        data[i] = rte_pktmbuf_mtod(mbufs[i], uint8_t *);
        room[i] = rte_pktmbuf_tailroom(mbufs[i]);
    }
    return 0;
}

uint16_t ina_tx_filled(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs,
                       const uint16_t *len, uint16_t n) {
    for (uint16_t i = 0; i < n; i++) {
        mbufs[i]->data_len = len[i];
        mbufs[i]->pkt_len = len[i];
    }
    return rte_eth_tx_burst(port, queue, mbufs, n);
}

uint16_t ina_pool_data_room(struct rte_mempool *pool) { return rte_pktmbuf_data_room_size(pool); }

const char *ina_version(void) { return rte_version(); }
