#include "model/synthetic_corpus.h"

namespace tandem {

std::string_view synthetic_tokenizer_corpus() {
  return R"(The quick brown fox jumps over the lazy dog. A mixture of experts model routes every
token to a few of its many experts, so only a small part of the weights is read for each token.
The router scores each expert, the best ones are chosen, and their outputs are added with the
weights the router gave them. Shared experts see every token. The attention layer compresses
keys and values into a small latent vector, which is what the cache stores for each position.
When the model is larger than the memory of the graphics card, the experts that do not fit stay
in the main memory of the computer and the processor computes them at the same time as the card
computes the rest. The plan says where every part of the model lives and how fast it will run.
People want to know before they buy a second card whether it will make their model faster, and
by how much. They want the model to load in seconds, not in an hour, and they want to serve
many users at once through the same interface that their tools already speak.

In the beginning there was the file, and the file had a header, and the header had keys and
values, and then the tensors came, each one with a name, a shape, a type and an offset. Every
number in a file can be wrong, so every number is checked before it is trusted. If the number
is wrong, the error says which file, which field, and what to do about it.

Hello, world! How are you today? I am fine, thank you. What is the time? It is ten past nine.
Where are you going? I am going to the market to buy some bread, milk, eggs and apples. The
weather is nice today: the sun is shining and the sky is blue. Let us go for a walk in the park
and then have a cup of tea. One, two, three, four, five, six, seven, eight, nine, ten.
1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 1000, 2024, 2025, 2026, 3.14159, 2.71828, 42.

def forward(self, tokens, positions):
    hidden = self.embed(tokens)
    for layer in self.layers:
        hidden = hidden + layer.attention(self.norm(hidden), positions)
        hidden = hidden + layer.feed_forward(self.norm(hidden))
    return self.output(self.norm(hidden))

for (int i = 0; i < n; ++i) {
    sum += weights[i] * inputs[i];
}
return sum;

int main(int argc, char** argv) {
    if (argc < 2) {
        printf("usage: %s FILE\n", argv[0]);
        return 1;
    }
    return run(argv[1]);
}
)";
}

}  // namespace tandem
