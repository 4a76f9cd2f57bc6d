#include "base/secret_box.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include "base/hash.h"

namespace hr::secrets {

namespace {

constexpr std::string_view kPrefix = "hrenc1:";
constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

std::mutex g_mu;
std::string g_key;  // guarded by g_mu: empty when none
bool g_env_tried = false;

std::string key_now() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_key.empty() || g_env_tried) return g_key;
  }
  (void)load_key_from_env();
  std::lock_guard<std::mutex> lock(g_mu);
  return g_key;
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return std::nullopt;
      }
    }
    out[i] = static_cast<char>(v);
  }
  return out;
}

struct CipherCtx {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(ctx); }
};

const unsigned char* bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

Status load_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read the secret key file " + path, "secret-key-file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  std::optional<std::string> key = from_hex(std::string_view(text).substr(start));
  if (!key || key->size() != kKeyBytes) {
    return invalid_argument(
        "the secret key file " + path + " must hold 64 hex digits (openssl rand -hex 32 > FILE)",
        "secret-key-file");
  }
  set_key(*key);
  return Status::ok();
}

Status load_key_from_env() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_key.empty()) return Status::ok();
    g_env_tried = true;
  }
  const char* path = std::getenv("HEADROOM_SECRET_KEY_FILE");
  if (path == nullptr || *path == '\0') return Status::ok();
  return load_key_file(path);
}

void set_key(std::string_view key) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_key = std::string(key);
}

void clear_key() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_key.clear();
  g_env_tried = true;
}

bool has_key() { return !key_now().empty(); }

std::string new_key_text() {
  unsigned char key[kKeyBytes];
  if (RAND_bytes(key, sizeof key) != 1) std::abort();
  return to_hex(std::string_view(reinterpret_cast<const char*>(key), sizeof key));
}

bool is_sealed(std::string_view stored) { return stored.starts_with(kPrefix); }

std::string seal(std::string_view plaintext) {
  const std::string key = key_now();
  if (key.empty()) return std::string(plaintext);
  std::string out(kNonceBytes + plaintext.size() + kTagBytes, '\0');
  auto* nonce = reinterpret_cast<unsigned char*>(out.data());
  if (RAND_bytes(nonce, kNonceBytes) != 1) std::abort();
  CipherCtx c;
  int len = 0;
  auto* ct = reinterpret_cast<unsigned char*>(out.data() + kNonceBytes);
  if (EVP_EncryptInit_ex(c.ctx, EVP_aes_256_gcm(), nullptr, bytes(key), nonce) != 1 ||
      EVP_EncryptUpdate(c.ctx, ct, &len, bytes(plaintext), static_cast<int>(plaintext.size())) !=
          1 ||
      EVP_EncryptFinal_ex(c.ctx, ct + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes,
                          out.data() + kNonceBytes + plaintext.size()) != 1) {
    std::abort();  // OpenSSL failing to encrypt with a valid key: nothing sane to go on with
  }
  return std::string(kPrefix) + base64_encode(out);
}

Result<std::string> open(std::string_view stored) {
  if (!is_sealed(stored)) return std::string(stored);
  const std::string key = key_now();
  if (key.empty()) {
    return Status(StatusCode::kFailedPrecondition,
                  "a secret is sealed but this process has no key (--secret-key-file)");
  }
  std::optional<std::string> raw = base64_decode(stored.substr(kPrefix.size()));
  if (!raw || raw->size() < kNonceBytes + kTagBytes) {
    return Status(StatusCode::kInternal, "a sealed secret is malformed");
  }
  const size_t n = raw->size() - kNonceBytes - kTagBytes;
  std::string plain(n, '\0');
  CipherCtx c;
  int len = 0;
  auto* out = reinterpret_cast<unsigned char*>(plain.data());
  std::string tag = raw->substr(kNonceBytes + n);
  const bool ok =
      EVP_DecryptInit_ex(c.ctx, EVP_aes_256_gcm(), nullptr, bytes(key), bytes(*raw)) == 1 &&
      EVP_DecryptUpdate(c.ctx, out, &len, bytes(*raw) + kNonceBytes, static_cast<int>(n)) == 1 &&
      EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) == 1 &&
      EVP_DecryptFinal_ex(c.ctx, out + len, &len) == 1;
  if (!ok) {
    return Status(StatusCode::kInternal,
                  "a sealed secret does not open with this key (another key, or altered)");
  }
  return plain;
}

}  // namespace hr::secrets
