#include "tokenizer/bpe_merge.hpp"

#include <queue>

namespace qforge {

void MergeTable::add(int32_t left, int32_t right, double priority, int32_t merged) {
    pairs_.insert_or_assign(key(left, right), Merge{priority, merged});
}

namespace {

struct Candidate {
    double priority;
    uint32_t pos;  // index of the left symbol (its original position: order is preserved)
    int32_t left, right;
    // std::priority_queue pops the largest: "larger" here means worse priority, then further right.
    bool operator<(const Candidate& o) const {
        if (priority != o.priority) return priority > o.priority;
        return pos > o.pos;
    }
};

constexpr uint32_t kNone = UINT32_MAX;

}  // namespace

void bpe_merge(std::vector<int32_t>& symbols, const MergeTable& table) {
    const size_t n = symbols.size();
    if (n < 2) return;
    // A doubly linked list over the original positions; a merged-away symbol is marked dead.
    std::vector<uint32_t> prev(n), next(n);
    std::vector<int32_t> id = symbols;
    std::vector<char> alive(n, 1);
    for (size_t i = 0; i < n; ++i) {
        prev[i] = i == 0 ? kNone : static_cast<uint32_t>(i - 1);
        next[i] = i + 1 == n ? kNone : static_cast<uint32_t>(i + 1);
    }
    std::vector<Candidate> initial;
    initial.reserve(n);
    for (size_t i = 0; i + 1 < n; ++i)
        if (const auto* m = table.find(id[i], id[i + 1]))
            initial.push_back({m->priority, static_cast<uint32_t>(i), id[i], id[i + 1]});
    std::priority_queue<Candidate> heap(std::less<Candidate>(), std::move(initial));
    auto push = [&](uint32_t l) {
        if (l == kNone || next[l] == kNone) return;
        if (const auto* m = table.find(id[l], id[next[l]]))
            heap.push({m->priority, l, id[l], id[next[l]]});
    };
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        // Stale entries: a merge only ever makes a symbol's token longer, so a symbol whose id
        // and right neighbour's id still match the entry is exactly the pair that was queued.
        if (!alive[c.pos] || id[c.pos] != c.left) continue;
        const uint32_t r = next[c.pos];
        if (r == kNone || id[r] != c.right) continue;
        id[c.pos] = table.find(c.left, c.right)->merged;
        alive[r] = 0;
        next[c.pos] = next[r];
        if (next[r] != kNone) prev[next[r]] = c.pos;
        push(prev[c.pos]);
        push(c.pos);
    }
    symbols.clear();
    for (uint32_t i = 0; i != kNone; i = next[i]) symbols.push_back(id[i]);
}

void bpe_merge_reference(std::vector<int32_t>& symbols, const MergeTable& table) {
    for (;;) {
        size_t best = symbols.size();
        const MergeTable::Merge* best_merge = nullptr;
        for (size_t i = 0; i + 1 < symbols.size(); ++i) {
            const auto* m = table.find(symbols[i], symbols[i + 1]);
            if (m && (!best_merge || m->priority < best_merge->priority)) best = i, best_merge = m;
        }
        if (!best_merge) return;
        symbols[best] = best_merge->merged;
        symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
}

}  // namespace qforge
