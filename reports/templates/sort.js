// Sortable tables: a click on a header sorts the rows by that column (numbers as numbers, blanks last).
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var num = th.hasAttribute("data-num");
      var asc = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("th").forEach(function (o) { o.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].textContent, y = b.cells[col].textContent;
        if (x === "" || y === "") { return (x === "") - (y === ""); }
        var c = num ? parseFloat(x) - parseFloat(y) : x.localeCompare(y, undefined, {numeric: true});
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
// A link to a finding's evidence opens its <details>.
function openTarget() {
  var el = location.hash ? document.getElementById(decodeURIComponent(location.hash.slice(1))) : null;
  if (el && el.tagName === "DETAILS") { el.open = true; }
}
window.addEventListener("hashchange", openTarget);
openTarget();
