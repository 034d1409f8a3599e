// The tokenbus console: one page, a view per hash route (#/fleet ...). Plain
// ES modules, no framework and no build step (docs/console.md says why).
import {admin, token, setToken, signOut, takeFragmentToken, whenUnauthorized} from "./api.js";
import {h} from "./dom.js";
import {fleet} from "./pages/fleet.js";
import {models} from "./pages/models.js";
import {keys} from "./pages/keys.js";
import {batches} from "./pages/batches.js";
import {playground} from "./pages/playground.js";
import {traffic} from "./pages/traffic.js";
import {tenants} from "./pages/tenants.js";

const pages = {fleet, models, keys, tenants, batches, playground, traffic};
const view = document.getElementById("view");
const nav = document.getElementById("nav");
const signin = document.getElementById("signin");
const status = document.getElementById("status");
const signoutButton = document.getElementById("signout");
let stop = () => {}; // ends the current page's timers and streams
let config = null;   // GET /console/config

// say shows a message in the live region (screen readers read it).
export function say(msg, error = false) {
  status.textContent = msg;
  status.classList.toggle("error", error);
}

function showSignin(message) {
  stop();
  stop = () => {};
  nav.hidden = true;
  signoutButton.hidden = true;
  view.replaceChildren(signin);
  signin.hidden = false;
  if (message) say(message, true);
  signin.querySelector("input").focus();
}

async function route() {
  if (!token()) return showSignin();
  if (!config) {
    try {
      config = await admin("/console/config");
    } catch (e) {
      return showSignin(e.status === 401 ? "That admin token was refused." : "The admin API did not answer: " + e.message);
    }
  }
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1];
  if (!pages[name]) {
    history.replaceState(null, "", "#/fleet");
    return route();
  }
  stop();
  nav.hidden = false;
  signoutButton.hidden = false;
  for (const a of nav.querySelectorAll("a")) {
    if (a.getAttribute("href") === "#/" + name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  say("");
  const root = h("section", {id: "page-" + name, "aria-labelledby": "title"});
  view.replaceChildren(root);
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · tokenbus console`;
  const ctl = new AbortController();
  const timers = [];
  const ctx = {
    root, config, signal: ctl.signal, say,
    every(ms, f) { f(); timers.push(setInterval(f, ms)); },
  };
  stop = () => { ctl.abort(); timers.forEach(clearInterval); };
  try {
    await pages[name](ctx);
  } catch (e) {
    if (!ctl.signal.aborted) say(e.message, true);
  }
  view.focus(); // keyboard and screen reader users start at the new page
}

signin.addEventListener("submit", (ev) => {
  ev.preventDefault();
  setToken(signin.querySelector("input").value.trim());
  signin.reset();
  config = null;
  route();
});
signoutButton.addEventListener("click", () => { signOut(); config = null; showSignin("Signed out."); });
whenUnauthorized(() => { signOut(); config = null; showSignin("The admin token was refused; sign in again."); });
window.addEventListener("hashchange", route);
takeFragmentToken();
route();
