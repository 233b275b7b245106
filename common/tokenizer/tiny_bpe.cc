// MakeTinyBpe: a deterministic byte-level BPE vocabulary trained on a small built-in text.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer_data.h"

namespace ds {
namespace {

// Original text written for this project: plain English, a little dialogue, and code in a few
// languages, so that the learned merges cover common words, indentation and operators.
constexpr const char kTrainingText[] = R"TXT(The keeper of the old lighthouse woke before the sun every morning. He climbed the
spiral stairs, counted the steps out loud, and wiped the salt from the great glass lens. The sea
was never the same twice: some days it was flat and grey like a sheet of tin, and on other days
the waves came in tall and white and loud. He wrote everything down in a thick blue notebook.
"Wind from the north, three boats in the bay, one gull with a bent wing," he would write, and
then he would make a cup of tea and sit by the window to watch the light change over the water.

People in the village said that the keeper did not like visitors, but that was not true. He
simply did not know what to say to them. When the children came up the hill with questions, he
showed them how the lamp turned, how the clockwork was wound, and how the bright beam could be
seen from thirty miles away. "Why does it have to turn?" asked a small girl. "So that the ships
know which light it is," he answered. "Every lighthouse has its own pattern, like a name."

In the winter the storms were long and the nights were longer. The keeper kept the lamp burning,
checked the oil, and listened to the rain on the roof. He was not afraid of the dark; he thought
of it as a quiet friend that asked nothing of him. When spring returned, the first thing he did
was to open all the windows and let the warm air move through the rooms.

User: Can you explain what a tokenizer does?
Assistant: A tokenizer splits text into small pieces called tokens and maps each piece to a
number. The model only sees these numbers. Common words become a single token, while rare words
are built from several smaller pieces. This keeps the vocabulary small but still lets the model
read any text, including names, numbers, and code.
User: What happens with numbers like 2024 or 3.14159?
Assistant: The pre-tokenizer splits digits one at a time, so 2024 becomes 2, 0, 2, 4. That makes
arithmetic patterns easier to learn and keeps the vocabulary from filling up with numbers.

def count_words(text: str) -> dict[str, int]:
    """Return how many times each word appears in the text."""
    counts: dict[str, int] = {}
    for word in text.lower().split():
        word = word.strip(".,!?;:\"'")
        if not word:
            continue
        counts[word] = counts.get(word, 0) + 1
    return counts


class Stack:
    def __init__(self):
        self.items = []

    def push(self, value):
        self.items.append(value)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()


#include <cstdio>
#include <string>
#include <vector>

struct Point {
  float x = 0.0f;
  float y = 0.0f;
};

static float Dot(const Point& a, const Point& b) { return a.x * b.x + a.y * b.y; }

int main(int argc, char** argv) {
  std::vector<Point> points = {{1.0f, 2.0f}, {3.0f, 4.0f}};
  for (size_t i = 0; i < points.size(); ++i) {
    std::printf("%zu: %f\n", i, Dot(points[i], points[0]));
  }
  return 0;
}

function fetchUser(id) {
  return fetch(`/api/users/${id}`)
    .then((response) => response.json())
    .catch((error) => console.error("request failed", error));
}

{"name": "lighthouse", "version": "1.0.0", "enabled": true, "tags": ["sea", "light", "keeper"]}

The model reads the prompt, predicts the next token, appends it, and repeats until it produces an
end token or reaches the length limit. Each step depends on all of the tokens before it, which
is why a long prompt takes more time than a short one. Good serving systems reuse the work done
for the prompt, batch many requests together, and stream the answer back as soon as each new
piece of text is ready.
)TXT";

}  // namespace

const char* TinyBpeTrainingText() { return kTrainingText; }

TokenizerData MakeTinyBpe(int n_merges) {
  n_merges = std::clamp(n_merges, 0, kMaxTinyMerges);
  TokenizerData d;
  d.model = "gpt2";
  d.pre = "qwen35";

  std::vector<std::string> pieces;  // raw bytes by id
  std::unordered_map<std::string, int32_t> piece_id;
  for (uint8_t b : tok::BytesInCanonicalOrder()) {
    piece_id.emplace(std::string(1, static_cast<char>(b)), static_cast<int32_t>(pieces.size()));
    pieces.emplace_back(1, static_cast<char>(b));
  }

  // Word frequencies of the pre-tokenized text (std::map: deterministic iteration order).
  auto pretok = tok::PreTokenizer::Create("qwen35");
  std::map<std::string, int64_t> freq;
  if (pretok.ok()) {
    std::vector<std::string_view> words;
    if (pretok->Split(kTrainingText, &words).ok()) {
      for (std::string_view w : words) ++freq[std::string(w)];
    }
  }
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, c] : freq) {
    Word word{{}, c};
    for (char ch : w) word.syms.push_back(piece_id.at(std::string(1, ch)));
    words.push_back(std::move(word));
  }

  for (int round = 0; round < n_merges; ++round) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pair_count;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) pair_count[{w.syms[i], w.syms[i + 1]}] += w.count;
    }
    if (pair_count.empty()) break;  // every word is a single token already
    // Most frequent; std::map order makes ties go to the lowest (left, right).
    auto best = pair_count.begin();
    for (auto it = pair_count.begin(); it != pair_count.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    const std::string merged = pieces[a] + pieces[b];
    int32_t id;
    auto found = piece_id.find(merged);
    if (found != piece_id.end()) {
      id = found->second;
    } else {
      id = static_cast<int32_t>(pieces.size());
      piece_id.emplace(merged, id);
      pieces.push_back(merged);
    }
    d.merges.push_back(tok::BytesToGpt2(pieces[a]) + " " + tok::BytesToGpt2(pieces[b]));
    for (Word& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w.syms[i]);
        }
      }
      w.syms = std::move(out);
    }
  }

  for (const std::string& p : pieces) {
    d.tokens.push_back(tok::BytesToGpt2(p));
    d.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    d.tokens.emplace_back(special);
    d.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  const auto n = static_cast<int32_t>(d.tokens.size());
  d.pad_id = n - 3;  // <|endoftext|>
  d.eos_id = n - 1;  // <|im_end|>
  d.bos_id = -1;
  d.add_bos = false;
  return d;
}

}  // namespace ds
