#pragma once
// The chat page served at "/": one self-contained HTML document (CSS and JS inline, no build
// step, nothing fetched from elsewhere). It talks to the same OpenAI API as any client.
#include <string_view>

namespace tandem::server {

std::string_view web_page_html();

}  // namespace tandem::server
